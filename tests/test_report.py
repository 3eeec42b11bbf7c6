"""`porter report`: the static site a reviewer reads, built from a small workspace (no nvcc)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from porter.cli import main
from porter.report import build
from porter.report.links import broken_links
from porter.commands.status import StatusReport
from ws_builder import TARGET, make_workspace

REFUSED = "mini_gpu_swiglu_tensor"
BUILT = "mini_gpu_add_tensor"
EXHAUSTED = "mini_gpu_synchronize"


@pytest.fixture(autouse=True)
def _no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def ws(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    ws.fail(REFUSED, 1, gate="build", summary="nvcc: 1 error",
            diagnostics='kernel.cu(3): error: identifier "blockIdy" is undefined\n1 error detected\n')
    ws.fail(REFUSED, 2, gate="static", summary="stub body: it only returns -1 <script>alert(1)</script>")
    ws.port(REFUSED, 3)
    ws.port(BUILT, 1, state="built")
    ws.fail(EXHAUSTED, 1, gate="static", summary="no kernel launch")
    ws.exhaust(EXHAUSTED, 1)
    return ws


@pytest.fixture
def site(ws, tmp_path):
    index = build(ws.root, TARGET, tmp_path / "site")
    return index.parent


def page(site: Path, unit: str) -> str:
    return (site / "units" / f"{unit}.html").read_text()


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_every_unit_has_a_page_and_every_link_resolves(ws, site):
    assert sorted(p.stem for p in (site / "units").glob("*.html")) == sorted(ws.target.units)
    assert (site / "graph.html").is_file() and (site / "style.css").is_file()
    assert broken_links(site) == []
    index = (site / "index.html").read_text()
    for unit in ws.target.units:  # the overview links every unit page, the graph the drawn ones
        assert f'href="units/{unit}.html"' in index


def test_graph_colours_units_by_state_and_draws_entry_to_kernel(site):
    from porter.report.graph import STATE_COLOURS

    svg = (site / "graph.html").read_text()
    box = re.search(rf'<a href="units/{REFUSED}.html"><rect [^>]*fill="([^"]+)"', svg)
    assert box and box.group(1) == STATE_COLOURS["verified"]
    assert re.search(rf'<a href="units/{BUILT}.html"><rect [^>]*fill="{STATE_COLOURS["built"]}"', svg)
    assert ">mini_engine_prefill<" in svg and ">kernel_swiglu_f32<" in svg
    assert svg.count("<path ") >= 20  # entry -> unit and unit -> kernel edges


def test_the_link_check_can_fail(site):
    (site / "units" / f"{BUILT}.html").unlink()
    (site / "extra.html").write_text('<a href="index.html#no-such-id">x</a> <img src="https://example.org/x.png">')
    problems = broken_links(site)
    assert any(f"units/{BUILT}.html (no such file" in p for p in problems)
    assert any("no id 'no-such-id'" in p for p in problems)
    assert any("no external link" in p for p in problems)


def test_overview_counts_states_by_tier_and_names_what_is_missing(site):
    text = text_of((site / "index.html").read_text())
    assert "24: 1 verified, 1 built (not judged), 1 exhausted, 21 unported" in text
    assert re.search(r"critical path runtime\+prefill, \d+ units: 1 verified, 1 built \(not judged\), 1 exhausted", text)
    assert "attempts 5 in 1 run(s); 3 answers refused (2 by static, 1 by build)" in text
    assert "prefill unverified (no passing e2e record)" in text  # derive()'s prefill line: no e2e evidence
    assert "chain ok" in text and "UNKEYED" in text
    assert "uncalibrated never calibrated" in text
    # the timeline: run-1 made 5 attempts on 3 units, 3 refused, 2 steps
    assert re.search(r"run-1 \S+ \S+ 3 5 3 1 verified 1 built \(not judged\)", text), text[-300:]


def _greenish(colour: str) -> bool:
    r, g, b = (int(colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    return g > r + 30 and g > b + 30


def test_built_is_not_yet_judged_and_never_in_success_colours(site):
    """A CPU-only run ends every unit `built`, wrong answers included: it must not look like success."""
    from porter.report.graph import STATE_COLOURS
    from porter.commands.status import STATE_STYLE

    assert re.search(r'class="chip st-built">built \(not judged\)<', page(site, BUILT))
    css = (Path(__import__("porter.report", fromlist=["x"]).__file__).parent / "templates" / "style.css").read_text()
    rule = re.search(r"\.st-built \{([^}]*)\}", css).group(1)
    assert not any(_greenish(c) for c in re.findall(r"#[0-9a-fA-F]{6}", rule)), rule
    assert _greenish(STATE_COLOURS["verified"]) and not _greenish(STATE_COLOURS["built"])
    assert "green" in STATE_STYLE["verified"] and "green" not in STATE_STYLE["built"]


def test_unit_page_shows_sources_refusals_diff_and_evidence(site):
    html = page(site, REFUSED)
    text = text_of(html)
    assert "refused by build" in text and "refused by static" in text
    assert 'identifier "blockIdy" is undefined' in html.replace("&#34;", '"').replace("&quot;", '"')
    assert "kernel_swiglu_f32" in text  # the Metal kernel slice
    assert "swiglu_kernel" in text  # the CUDA file now
    assert text.count('class="code"') == 0 and html.count('class="code"') >= 3  # host, kernels, CUDA highlighted
    assert '<span class="gi">+' in html  # the landing commit's diff, highlighted as a diff
    assert "seeds 11, 12" in text and "nmse=1e-09" in text
    assert "No timing evidence" in text  # no GPU here: perf says so instead of inventing a number


def test_ledger_text_is_escaped_not_executed(site):
    html = page(site, REFUSED)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_tampered_evidence_shows_on_the_overview_and_the_unit(ws, tmp_path):
    ev = next((ws.root / "ledger" / "evidence").glob("*.json"))
    ev.write_text(ev.read_text().replace('"ok": true', '"ok": false').replace('"ok":true', '"ok":false'))
    site = build(ws.root, TARGET, tmp_path / "tampered").parent
    assert "tampered" in text_of((site / "index.html").read_text())
    tampered = [u for u in ws.target.units if "st-tampered\">tampered" in page(site, u)]
    assert tampered, "an edited evidence file must mark its unit tampered in the report"


def test_prefill_slot_shows_what_derive_reports(ws, tmp_path, monkeypatch):
    real = StatusReport.to_json
    monkeypatch.setattr(StatusReport, "to_json",
                        lambda self: dict(real(self), prefill={"state": "verified", "text": "verified at 0123abcd"}))
    site = build(ws.root, TARGET, tmp_path / "e2e").parent
    text = text_of((site / "index.html").read_text())
    assert "prefill verified at 0123abcd" in text and "no end-to-end evidence" not in text


def test_the_overview_plots_the_engines_tokens_per_second_against_upstream(ws, tmp_path, monkeypatch):
    """Status's throughput state is what the overview lists and draws: both phases, each bar with its figure,
    a slow phase marked, upstream's margin shaded; nothing is drawn where nothing was measured."""
    from porter.report import collect
    from porter.report.speed_chart import throughput_svg

    measured = {"state": "measured", "ok": False, "commit": "0123abcd" * 5, "reason": "", "phases": {
        "prefill": {"tps": 1038.1, "upstream_tps": 1087.4, "ratio": 0.95, "ok": True, "p_value": 0.114, "margin": 0.114},
        "decode": {"tps": 11.5, "upstream_tps": 23.6, "ratio": 0.49, "ok": False, "p_value": 0.002, "margin": 0.045}},
        "accuracy": {"positions": 2048, "mean_kld": 3.1e-05, "p99_kld": 2e-4, "max_kld": 1e-3, "same_top": 0.996}}
    real = collect.derive

    def with_throughput(*a, **k):
        st = real(*a, **k)
        st.throughput = measured
        return st

    monkeypatch.setattr(collect, "derive", with_throughput)
    site = build(ws.root, TARGET, tmp_path / "speed").parent
    html = (site / "index.html").read_text()
    text = text_of(html)
    assert "prefill: 1038.1 t/s (0.95x upstream, fast" in text and "decode: 11.5 t/s (0.49x upstream, SLOW" in text
    assert "accuracy (at 0123abcd0123): mean KLD 3.1e-05 (p99 0.0002), same top token 99.6% over 2048" in text
    svg = html[html.index('<svg class="throughput"'):html.index("</svg>", html.index('<svg class="throughput"'))]
    assert "1087.4 t/s" in svg and "1038.1 t/s (0.95x, fast)" in svg and "11.5 t/s (0.49x, SLOW)" in svg
    assert svg.count('fill="#cf222e"') == 1 and "A/A margin 11.4%" in svg
    assert throughput_svg(None) == "" and throughput_svg({"state": "unmeasured", "phases": {}}) == ""
    no_margin = {"state": "measured", "phases": {"prefill": dict(measured["phases"]["prefill"], margin=None)}}
    assert "1038.1 t/s (0.95x, fast)" in throughput_svg(no_margin)  # a record without a margin still draws
    monkeypatch.setattr(collect, "derive", real)  # the workspace's own status: no throughput declared, no chart
    plain = (build(ws.root, TARGET, tmp_path / "plain").parent / "index.html").read_text()
    assert '<svg class="throughput"' not in plain and "t/s" not in text_of(plain)


def test_cli_writes_the_site(ws, tmp_path, capsys):
    out = tmp_path / "cli-site"
    assert main(["-C", str(ws.root), "report", "--out", str(out)]) == 0
    assert f"report: {out / 'index.html'}" in capsys.readouterr().out
    assert (out / "units" / f"{BUILT}.html").is_file()


def test_out_that_is_a_file_is_bad_input(ws, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    assert main(["-C", str(ws.root), "report", "--out", str(f)]) == 2
    assert capsys.readouterr().err.startswith("porter: error: --out")


def test_perf_against_known_good_and_peak(tmp_path):
    """What a GPU run records (parity timing, perf ratio) is what the unit page shows, numbers and all."""
    from ws_builder import SOURCES

    ws = make_workspace(tmp_path / "gpu-ws")
    unit = "mini_gpu_add_tensor"
    cand = ws.write_unit(unit, SOURCES[unit])
    ws.attempt(unit, 1, SOURCES[unit])
    timing = {"case": "real 4096", "bytes": 49152, "median_ms": 0.0125, "p90_ms": 0.013, "reps": 50,
              "gbps": 1376.3, "peak_gbps": 3352.0, "pct_of_peak": 41.06, "roofline_ms": 0.005}
    evidence = [ws.gate(unit, 1, "build", True, cand)[1],
                ws.gate(unit, 1, "parity", True, cand, seeds=["00000000000000aa", "00000000000000bb"],
                        timing=timing, regime={"name": "device"}, cases=[{"label": "real 4096", "passes": [{"metrics": {"out": {"nmse": 2e-12}}}],
                                               "timing": {"median_ms": 0.0125, "gbps": 1376.3}}])[1],
                ws.gate(unit, 1, "perf", True, cand, ratio=1.25, baseline={"median_ms": 0.01}, limit=1.3,
                        limit_basis="known-good spread 15.0% over 10 calls", decided_by="known-good")[1]]
    step = ws.ledger.append("step", target=TARGET, unit=unit, attempt=1, state="verified", candidate_sha256=cand,
                            unit_file=ws.rel(ws.unit_path(unit)), evidence=evidence)
    ws.commit_step(step)
    site = build(ws.root, TARGET, tmp_path / "gpu-site").parent
    text = text_of(page(site, unit))
    assert "0.0125 ms median on real 4096" in text
    assert "1376.3 GB/s, 41.1% of the device's peak (3352 GB/s)" in text
    assert "1.25x the known-good's 0.01 ms (limit 1.3x: known-good spread 15.0% over 10 calls)" in text
    assert "regime device" in text and "40.0% of the roofline" in text
    overview = text_of((site / "index.html").read_text())
    assert "speed (device regime): 1 unit(s) timed, geomean 1.25x the known-good over 1 unit(s)" in overview
    assert "seeds 00000000000000aa, 00000000000000bb" in text
    assert "real 4096 pass 1: out nmse=2e-12 0.0125 ms, 1376.3 GB/s" in text


def test_prefill_slot_shapes():
    from porter.report.collect import prefill_slot

    assert prefill_slot(None) == {"state": "none", "text": "no end-to-end evidence"}
    assert prefill_slot("stale: HEAD moved since the e2e run") == {"state": "stale",
                                                                   "text": "stale: HEAD moved since the e2e run"}
    assert prefill_slot({"state": "verified", "commit": "0123456789abcdef"}) == \
        {"state": "verified", "text": "verified at 0123456789ab"}
    assert prefill_slot({"state": "unverified", "reason": "no e2e record"})["text"] == "unverified (no e2e record)"


def test_a_unit_refused_on_one_required_architecture_says_which_in_the_report(ws, tmp_path, monkeypatch):
    """Issue 32: the report shows status's label, so a refusal on sm_121 reads 'failing (sm_121)' on the
    overview and on the unit's page, and a verification missing sm_121 is 'built (sm_121 not measured)'."""
    monkeypatch.setenv("PORTER_REQUIRE_ARCH", "sm_90,sm_121")
    per_arch = {"sm_90": {"measured": True, "ok": True, "summary": "", "evidence": {}},
                "sm_121": {"measured": True, "ok": False, "summary": "", "evidence": {}}}
    ws.fail("mini_gpu_tensor_bytes", 1, gate="parity", summary="[sm_121] parity failed", facts={"archs": per_arch})
    site = build(ws.root, TARGET, tmp_path / "archs").parent
    assert "failing (sm_121)" in text_of((site / "index.html").read_text())
    assert "failing (sm_121)" in text_of(page(site, "mini_gpu_tensor_bytes"))
    # verified in host mode, on no GPU kind at all: neither required kind was measured
    assert "built (sm_90, sm_121 not measured)" in text_of(page(site, REFUSED))
