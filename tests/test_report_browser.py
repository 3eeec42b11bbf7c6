"""The report as a reviewer sees it: opened in headless Chromium, screenshotted, and checked for
what is on screen (boxes in the viewport, side-by-side panes, highlighting applied), not merely in
the DOM. Skipped, with the reason, where no Chromium is installed (Debian: apt-get install chromium)."""

from __future__ import annotations

import pytest

from chromium import Browser, box, find_chromium
from porter.report import build
from ws_builder import TARGET, make_workspace

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="no Chromium on PATH (Debian: apt-get install chromium; or set PORTER_CHROMIUM)")
UNIT = "mini_gpu_swiglu_tensor"


@pytest.fixture(autouse=True)
def _no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    ws = make_workspace(root / "ws")
    ws.fail(UNIT, 1, gate="static", summary="stub body: it only returns -1")
    ws.port(UNIT, 2)
    return build(ws.root, TARGET, root / "site").parent


def looks_at(site, tmp_path):
    """Open the overview and the unit page; return what is visible and where the screenshots are."""
    seen = {}
    with Browser(width=1400, height=1000) as b:
        b.open((site / "index.html").as_uri())
        seen["overview_png"] = b.screenshot(tmp_path / "overview.png")
        seen["title"] = box(b, "h1")
        seen["summary"] = box(b, "#summary table")
        seen["prefill"] = box(b, "td.prefill")
        seen["unit_links"] = b.eval("document.querySelectorAll('#units a[href^=\"units/\"]').length")
        b.open((site / "units" / f"{UNIT}.html").as_uri())
        seen["unit_png"] = b.screenshot(tmp_path / "unit.png")
        seen["state"] = box(b, "h1 .chip")
        seen["panes"] = b.eval("[...document.querySelectorAll('.side .pane')].map(p => "
                               "{const r = p.getBoundingClientRect(); return [r.left, r.right, r.top]})")
        seen["keyword"] = box(b, ".side .pane:last-child .code .k, .side .pane:last-child .code .kt")
        seen["refused"] = box(b, "table.kv .st-tampered")
    return seen


def test_overview_and_unit_page_render_as_meant(site, tmp_path):
    seen = looks_at(site, tmp_path)
    for png in (seen["overview_png"], seen["unit_png"]):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, f"{png} is not a rendered page"
    assert seen["title"]["shown"] and seen["title"]["text"] == f"porter report: {TARGET}"
    assert seen["summary"]["shown"], "the summary must be on the first screen"
    assert seen["prefill"]["shown"] and seen["prefill"]["text"] == "unverified (no passing e2e record)"
    assert seen["unit_links"] == 24
    assert seen["state"]["shown"] and seen["state"]["text"] == "verified"
    (l_left, l_right, l_top), (r_left, r_right, r_top) = seen["panes"]
    assert l_right <= r_left and abs(l_top - r_top) < 2, "Metal and CUDA must stand side by side"
    assert seen["keyword"]["shown"] and seen["keyword"]["color"] not in ("rgb(0, 0, 0)", "rgb(31, 35, 40)"), \
        "CUDA keywords must be coloured (Pygments styles applied)"
    assert seen["refused"]["shown"] and "refused by static" in seen["refused"]["text"]


def test_the_browser_checks_can_fail(site, tmp_path):
    """Without the stylesheet the panes stack and keywords lose their colour: the checks above see it."""
    (site / "style.css").rename(site / "style.css.off")
    try:
        seen = looks_at(site, tmp_path)
    finally:
        (site / "style.css.off").rename(site / "style.css")
    (l_left, l_right, l_top), (r_left, r_right, r_top) = seen["panes"]
    assert not (l_right <= r_left and abs(l_top - r_top) < 2)
    assert seen["keyword"]["color"] in ("rgb(0, 0, 0)",)
