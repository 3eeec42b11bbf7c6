"""The perf gate always decides: against the known-good where calibrated, else against the
roofline floor; a verified unit without passing perf evidence says so in status."""

from __future__ import annotations

import pytest

from porter.gates import perf
from porter.gates.driver import Candidate, GateContext
from porter.gates.result import GateResult
from porter.status import PERF_UNMEASURED, derive
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
    strict = _timed(0.0205, perf_floor=0.9)
    assert perf.floor_ms(strict.evidence["timing"])[0] < allowed_default
    assert _perf(workspace, _timed(0.0205)).ok
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
