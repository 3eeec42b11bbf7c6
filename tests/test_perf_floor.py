"""The perf gate always decides: against the known-good where calibrated, else against the
roofline floor; a verified unit without passing perf evidence says so in status."""

from __future__ import annotations

import pytest

from porter.gates import perf
from porter.gates.driver import Candidate, GateContext
from porter.gates.result import GateResult
from porter.commands.status import PERF_UNMEASURED, derive
from porter.target import load_target

from tests.test_perf_gate import CASE, UNIT, _calibrate, _parity
from ws_builder import TARGET, make_workspace

# the prefill case: 256x256 Q8_0 weights (69632 bytes) + 64 tokens of f32 in and out
BYTES = 256 * 256 // 32 * 34 + 4 * 64 * (256 + 256)
PEAK_GBPS = 3352.0  # an H100 SXM's HBM3


def _timed(median_ms: float, **more) -> GateResult:
    p = _parity(median_ms)
    p.evidence["timing"].update(bytes=BYTES, peak_gbps=PEAK_GBPS, roofline_ms=BYTES / (PEAK_GBPS * 1e9) * 1e3, **more)
    return p


def _perf(ws, parity: GateResult) -> GateResult:
    return perf.run(Candidate.of(UNIT, ""), GateContext(load_target(ws, "minimoe"), ws, results={"parity": parity}))


def test_without_a_baseline_the_roofline_floor_decides(workspace):
    # a one-thread-per-output kernel: 16384 outputs x 256 MACs each, serially per thread: milliseconds
    slow = _perf(workspace, _timed(2.5))
    assert not slow.ok and not slow.skipped and slow.check == "floor", slow.summary
    assert "no known-good" in slow.summary and slow.evidence["decided_by"] == "roofline floor"
    good = _perf(workspace, _timed(0.006))
    assert good.ok and not good.skipped, good.summary


def test_the_host_regime_special_case_is_gone(workspace):
    """ds4's old [perf] roofline_floor = false (weights read over the host link, so no HBM floor and perf
    unmeasured without a known-good) is refused as a setting: the target declares the regime it runs in,
    and the floor decides in it."""
    from porter.errors import PorterError

    toml = workspace / "targets" / TARGET / "target.toml"
    original = toml.read_text()
    toml.write_text(original + '\n[perf]\nroofline_floor = false\n')
    with pytest.raises(PorterError):
        load_target(workspace, "minimoe")
    toml.write_text(original + '\n[perf]\nregime = "host"\n')
    res = _perf(workspace, _timed(2.5))
    assert not res.skipped and not res.ok and res.check == "floor", res.summary


def test_the_spec_declares_its_floor(workspace):
    allowed_default = perf.floor_ms(_timed(1.0).evidence["timing"])[0]
    # between what a 0.9 share allows and what the default share allows on this case's roofline
    t = perf.LAUNCH_ALLOWANCE_MS + 10 * _timed(1.0).evidence["timing"]["roofline_ms"]
    strict = _timed(t, perf_floor=0.9)
    assert perf.floor_ms(strict.evidence["timing"])[0] < allowed_default
    assert _perf(workspace, _timed(t)).ok
    assert not _perf(workspace, strict).ok


def test_no_roofline_and_no_baseline_is_skipped(workspace):
    r = _perf(workspace, _parity(1.0))
    assert r.skipped and not r.ok and "no roofline" in r.summary


def test_status_never_says_plain_verified_without_perf(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    ws.port("mini_gpu_synchronize")
    ws.port("mini_gpu_swiglu_tensor", perf=False)
    r = derive(ws.root, TARGET)
    assert r.unit("mini_gpu_synchronize").state == "verified"
    u = r.unit("mini_gpu_swiglu_tensor")
    assert u.state == PERF_UNMEASURED and "perf" in u.reason
    assert r.counts["verified"] == 1 and r.counts[PERF_UNMEASURED] == 1


# --- the ds4 floors and the launch allowance, against what upstream measured (targets/ds4/perf/h200.json) ---

def _ds4_measured() -> tuple[dict, dict]:
    import json
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "targets" / "ds4"
    return json.loads((root / "perf" / "h200.json").read_text()), tomllib.loads((root / "target.toml").read_text())


def _floor_for(row: dict, floors: dict, allowance: float | None = None) -> float:
    """The slowest time ds4's declared floor allows on the row's timed case (its roofline from the row)."""
    timing = {"roofline_ms": row["ms"] * row["pct_roofline"] / 100.0}
    frac = floors.get(row["unit"]) or perf.DEFAULT_FLOOR_FRACTION
    allowed, _ = perf.floor_ms(timing, frac)
    if allowance is not None:
        allowed += allowance - perf.LAUNCH_ALLOWANCE_MS
    return allowed


def test_upstream_ds4_meets_every_floor_ds4_declares_as_measured():
    # a floor the known-good itself cannot meet is a wrong floor: both of upstream's timings of each op
    # (the first run and the re-time in a fresh process) must pass it
    measured, toml = _ds4_measured()
    floors = toml["perf"]["floors"]
    assert len(measured["rows"]) == 57 and len(floors) >= 50
    for row in measured["rows"]:
        allowed = _floor_for(row, floors)
        assert row["ms"] <= allowed and row["again_ms"] <= allowed, (row["unit"], row["ms"], row["again_ms"], allowed)
        assert set(floors) <= {r["unit"] for r in measured["rows"]}


def test_the_declared_floors_alone_refuse_the_measured_slow_perf_mutants():
    # without a known-good (another GPU kind), the floors still catch the serial kernels calibration caught
    measured, toml = _ds4_measured()
    floors, rows = toml["perf"]["floors"], {r["unit"]: r for r in measured["rows"]}
    slow = [m for m in measured["mutants"] if m["expect"] == "slowdown"]
    assert len(slow) >= 3
    for m in slow:
        assert m["ms"] > _floor_for(rows[m["unit"]], floors), (m["mutant"], m["ms"])


def test_the_old_launch_allowance_refused_upstreams_own_latency_bound_ops():
    # why the allowance is what it is: at 0.02 ms upstream's own few-launch ops fail their floor
    measured, toml = _ds4_measured()
    floors = toml["perf"]["floors"]
    refused = [r["unit"] for r in measured["rows"] if r["again_ms"] > _floor_for(r, floors, allowance=0.02)]
    assert "ds4_gpu_hc_split_sinkhorn_tensor" in refused and len(refused) >= 3, refused
