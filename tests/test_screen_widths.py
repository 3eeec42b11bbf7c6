"""Every screen reads at 80, 100, 120, 160 and 200 columns, for both bundled targets.

minimoe's short unit names once hid that ds4's (up to 51 characters) squeezed
status's reason column at 120 columns to a few letters wrapping letter by
letter. The unit names here come from the committed target folders (the
runtime list of target.toml and a parity spec per op), so no checkout is
needed; the reasons are as long as real compiler and ledger reasons get.
"""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from porter.commands import status as status_mod
from porter.calibration.calibrator import matrix, table
from porter.target.plan import RankedUnit, plan_table
from porter.commands.reverify import Reverdict, reverify_table
from porter.commands.status import STATES, StatusReport, UnitStatus, render
from porter.term import TAIL_MIN, Column, Table

REPO = Path(__file__).resolve().parents[1]
WIDTHS = [80, 100, 120, 160, 200]
TARGETS = ["ds4", "minimoe"]

REASONS = [
    "placeholder, no attempt",
    "build: compile error: ds4_gpu_attention_prefill_static_mixed_heads_tensor.cu:212:17: error: identifier "
    "\"kv_heads\" is undefined; 3 more errors in the unit's own lines",
    "parity evidence 5c1e0f3a9b77 matches the current file (attempt 2, 2026-11-24 03:12 UTC); no passing perf "
    "evidence (perf skipped or off)",
    "stub body: it only returns -1 " + "and the compiler said a great deal more about it " * 3,
]


def unit_names(target: str) -> list[str]:
    folder = REPO / "targets" / target
    runtime = tomllib.loads((folder / "target.toml").read_text())["units"]["runtime"]
    ops = sorted(p.stem for p in (folder / "parity").glob("*.py") if not p.name.startswith("_"))
    return runtime + [u for u in ops if u not in runtime]


def test_the_names_are_the_long_real_ones():
    assert max(map(len, unit_names("ds4"))) >= 50 and len(unit_names("ds4")) >= 80


def report_of(target: str) -> StatusReport:
    names = unit_names(target)
    units = [UnitStatus(unit=u, state=STATES[i % len(STATES)], reason=REASONS[i % len(REASONS)], attempts=i % 4,
                        commit=f"{i:040x}" if i % 3 else None, tier=("runtime", "prefill", "decode", "unreachable")[i % 4])
             for i, u in enumerate(names)]
    counts = {s: sum(u.state == s for u in units) for s in STATES} | {"total": len(units)}
    return StatusReport(target=target, units=units, counts=counts,
                        critical_path={"available": True, "tiers": ["runtime", "prefill"], "counts": counts,
                                       "reason": None, "units": []},
                        ledger={"ok": True, "records": 3, "key": "unsigned", "problems": []})


def printed(draw, width: int) -> list[str]:
    buf = io.StringIO()
    draw(Console(file=buf, width=width, force_terminal=False, highlight=False))
    return buf.getvalue().splitlines()


def blocks(lines: list[str], names: list[str]) -> dict[str, list[str]]:
    """Each unit's lines: the one naming it and those under it, up to the next unit's."""
    out, cur = {}, None
    pattern = re.compile(r"^\s*(?:\d+\s+)?(\S+)")
    for line in lines:
        m = pattern.match(line)
        if m and m.group(1) in names:
            cur = m.group(1)
            out[cur] = [line]
        elif cur and line.strip():
            out[cur].append(line)
    return out


def squeezed(text: str) -> str:
    return "".join(text.split())


def assert_readable(lines: list[str], width: int, tails: dict[str, str], tail_header: str = "reason") -> None:
    """No line past the width; every unit named whole on a line of its own; every reason shown whole, and
    each of its lines given at least a readable width (or the reason's own length, if shorter)."""
    assert max(cell_len(line) for line in lines) <= width, "\n".join(lines)
    found = blocks(lines, list(tails))
    assert set(found) == set(tails), set(tails) - set(found)
    header = next((x for x in lines if x.rstrip().endswith(tail_header) and "/" not in x), None)
    beside_at = header.rstrip().rindex(tail_header) if header else None  # the tail's column, when beside
    for unit, tail in tails.items():
        block = found[unit]
        assert squeezed(tail) in squeezed(" ".join(block)), f"reason not shown whole: {tail!r} in {block}"
        if not tail:
            continue
        need = min(TAIL_MIN, len(tail))
        starts = [len(x) - len(x.lstrip()) for x in block[1:]]
        if beside_at is not None:
            starts.append(beside_at)
        for start in starts:
            assert width - start >= need, f"{unit}: reason given {width - start} columns at {width}:\n" + \
                "\n".join(block)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("width", WIDTHS)
def test_status_reads_at_every_width(target, width):
    report = report_of(target)
    lines = printed(lambda con: render(report, con), width)
    assert_readable(lines, width, {u.unit: u.reason for u in report.units})
    head = " ".join(lines[:4])
    assert all(w in head for w in ("unit", "state", "att", "reason")), lines[:4]


def test_at_120_columns_ds4s_reason_keeps_its_own_readable_column_or_line():
    """The case that broke: 120 columns, ds4's names, a long reason."""
    report = report_of("ds4")
    lines = printed(lambda con: render(report, con), 120)
    block = blocks(lines, [u.unit for u in report.units])["ds4_gpu_attention_prefill_static_mixed_heads_tensor"]
    assert_readable(lines, 120, {u.unit: u.reason for u in report.units})
    reason = report.unit("ds4_gpu_attention_prefill_static_mixed_heads_tensor").reason
    assert squeezed(reason) in squeezed(" ".join(block)) and len(block) <= 1 + len(reason) // TAIL_MIN + 1


def test_a_fresh_ds4_workspace_keeps_one_line_per_unit_at_80_columns():
    """All unported, tiers up to 'unreachable': two-space gaps are one column too many at 80; one space
    keeps each unit's state on its line instead of stacking three lines a unit."""
    names = unit_names("ds4")
    units = [UnitStatus(unit=u, state="unported", reason="placeholder, no attempt", tier=("runtime", "unreachable")[i % 2])
             for i, u in enumerate(names)]
    counts = {s: 0 for s in STATES} | {"unported": len(units), "total": len(units)}
    report = StatusReport(target="ds4", units=units, counts=counts,
                          critical_path={"available": True, "tiers": ["runtime"], "counts": counts, "reason": None,
                                         "units": []},
                          ledger={"ok": True, "records": 0, "key": "unsigned", "problems": []})
    lines = printed(lambda con: render(report, con), 80)
    assert_readable(lines, 80, {u.unit: u.reason for u in units})
    for u in names:
        row = next(x for x in lines if x.split() and x.split()[0] == u)
        assert "unported" in row, row


def ranked_of(target: str) -> list[RankedUnit]:
    names = unit_names(target)
    kernels = ["kernel_flash_attn_ext_vec_f16_dk512_dv512", "kernel_mul_mv_id_iq2_xxs_f32", "kernel_dsv4_topk_mask",
               "kernel_rms_norm_mul_f32_4"]
    return [RankedUnit(unit=u, tier=("runtime", "prefill", "decode", "unreachable")[i % 4], rank=i + 1,
                       reasons=["census FLAG: the model holds Q8_0 experts this unit was never asked for",
                                "unreachable: no engine function calls it"][: i % 3],
                       kernels=kernels[: i % 5], quant_types=["f16", "q8_0", "iq2_xxs", "q2_k"][: i % 5],
                       depth=i % 7 or None)
            for i, u in enumerate(names)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("width", WIDTHS)
def test_plan_reads_at_every_width(target, width):
    ranked = ranked_of(target)
    lines = [t.plain for t in plan_table(ranked).lines(width)]
    tails = {}
    for r in ranked:
        ks = ", ".join(r.kernels[:3]) + (f" +{len(r.kernels) - 3}" if len(r.kernels) > 3 else "")
        tails[r.unit] = "; ".join(x for x in (ks, "; ".join(r.reasons)) if x)
    assert_readable(lines, width, tails, "kernels / notes")


def calibration_report(target: str) -> dict:
    rows = []
    for i, u in enumerate(unit_names(target)):
        rows.append({"unit": u, "kind": "known-good", "name": "upstream", "expect": "pass", "got": "pass", "ok": True})
        rows.append({"unit": u, "kind": "mutant", "name": f"iq2_xxs-eighth-sign-dropped-{i}", "expect": "values",
                     "got": "values" if i % 5 else "guard", "ok": bool(i % 5)})
    return {"rows": rows}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_tables_read_at_every_width(target, width):
    rep = calibration_report(target)
    for text in (table(rep, width), matrix(rep, f"{target}_gpu_" if target == "ds4" else "mini_gpu_", width)):
        lines = text.splitlines()
        assert max(cell_len(line) for line in lines) <= width, text
    names = unit_names(target)
    assert blocks(table(rep, width).splitlines(), names).keys() == set(names)


def test_calibrate_table_unlimited_is_one_line_per_run():
    rep = calibration_report("ds4")
    assert len(table(rep).splitlines()) == 1 + len(rep["rows"])


@pytest.mark.parametrize("width", WIDTHS)
def test_reverify_section_reads_at_every_width(width):
    fresh = [Reverdict(u, ["static ok", "build REFUSED"], False, REASONS[1]) for u in unit_names("ds4")]
    lines = [t.plain for t in reverify_table(fresh).lines(width)]
    assert_readable(lines, width, {r.unit: r.summary for r in fresh}, "summary")


def test_a_new_column_is_one_more_column():
    """What a speed column needs: the layout takes any number of columns and keeps the reason readable."""
    t = Table([Column("unit", key=True), Column("state"), Column("ms", right=True), Column("% peak", right=True)],
              tail="reason")
    t.add_row("ds4_gpu_attention_prefill_static_mixed_heads_tensor", "verified", "1.25", "61%", tail=REASONS[2])
    for width in WIDTHS:
        lines = [x.plain for x in t.lines(width)]
        assert_readable(lines, width, {"ds4_gpu_attention_prefill_static_mixed_heads_tensor": REASONS[2]})
        assert "ms" in lines[0] and "% peak" in lines[0]


def test_the_width_check_catches_a_squeezed_reason():
    """assert_readable fails on the layout the old status printed at 120 columns: a 16-column reason."""
    unit = "ds4_gpu_attention_prefill_static_mixed_heads_tensor"
    cols = f"  {{:<51}}  {{:<7}}  {{:<21}}  {{:>3}}  {{:<10}}  "  # the reason starts at column 104
    old = [cols.format("unit", "tier", "state", "att", "commit") + "reason",
           cols.format(unit, "prefill", "exhausted", "3", "0000000001") + "placeholder, no",
           " " * 104 + "attempt"]
    with pytest.raises(AssertionError, match="reason given 16 columns"):
        assert_readable(old, 120, {unit: "placeholder, no attempt"})
    good = [cols.format("unit / reason", "tier", "state", "att", "commit").rstrip(), old[1].replace("placeholder, no", ""),
            "      placeholder, no attempt"]
    assert_readable(good, 120, {unit: "placeholder, no attempt"})


def test_status_reverify_and_audit_respect_columns_in_a_pipe(tmp_path, monkeypatch, capsys):
    """`--reverify`'s section and a piped `audit` follow COLUMNS (audit once forced 160 in a pipe)."""
    from porter.cli import main
    from ws_builder import make_workspace

    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ws = make_workspace(tmp_path / "ws")
    ws.fail("mini_gpu_routed_gate_up_iq2_xxs_tensor", 1, gate="static", summary=REASONS[3])
    monkeypatch.setattr(status_mod, "reverify",
                        lambda target, **kw: [Reverdict(u, ["static ok", "build REFUSED"], False, REASONS[1])
                                        for u in target.units])
    monkeypatch.setenv("COLUMNS", "80")
    main(["-C", str(ws.root), "status", "--reverify"])
    lines = capsys.readouterr().out.splitlines()
    section = lines[next(i for i, x in enumerate(lines) if x.startswith("re-verified now")):]
    assert len(section) > 5 and max(cell_len(x) for x in section) <= 80, "\n".join(section)
    main(["-C", str(ws.root), "audit", "mini_gpu_routed_gate_up_iq2_xxs_tensor"])
    lines = capsys.readouterr().out.splitlines()
    assert any("great deal more" in x for x in lines) and max(cell_len(x) for x in lines) <= 80, \
        max(lines, key=cell_len)
