"""The perf gate: a parity-correct candidate far slower than the calibrated known-good code is refused.

The failure it exists for is the failed ds4 port's one-thread-per-output kernel:
right numbers, hundreds of times slower.  Baselines come from `porter calibrate`
ledger records; without one the gate is skipped, never passed.
"""

from __future__ import annotations

from porter.evidence import store_evidence
from porter.gates import perf
from porter.gates.result import GateResult
from porter.ledger import Ledger
from porter.target import load_target
from porter.gates.driver import Candidate, GateContext, ParityOptions

UNIT = "mini_gpu_matmul_q8_0_tensor"
SPEC_SHA = "ab" * 32
CASE = "attn_q 256x256, 64 tokens (prefill)"


def _parity(median_ms: float, case: str = CASE, spec_sha: str = SPEC_SHA) -> GateResult:
    return GateResult("parity", True, "parity ok", evidence={
        "candidate_sha256": "cd" * 32, "spec": {"sha256": spec_sha},
        "timing": {"case": case, "median_ms": median_ms, "gbps": 1.0}, "toolchain": {"gpu": "test"}})


def _calibrate(ws, median_ms: float, spec_sha: str = SPEC_SHA, ok: bool = True) -> None:
    ev = store_evidence(ws, {"target": "minimoe", "unit": UNIT, "gate": "parity", "ok": ok, "candidate_sha256": None,
                             "toolchain": {}, "device": {"name": "NVIDIA H100"},
                             "timing": {"case": CASE, "median_ms": median_ms}})
    Ledger(ws).append("calibration", target="minimoe", unit=UNIT, ok=ok, spec_sha256=spec_sha,
                      known_good="scripted good answers", evidence=ev, summary="")


def test_a_serial_kernel_hundreds_of_times_slower_is_refused(workspace):
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5)}))
    assert not res.ok and not res.skipped
    assert res.summary.startswith("perf failed") and "(791.7x; limit 8x)" in res.summary
    assert res.evidence["baseline"]["median_ms"] == 0.012 and res.evidence["ratio"] > 700
    assert "single thread" in res.diagnostics


def test_a_kernel_near_the_baseline_passes(workspace):
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(0.018)}))
    assert res.ok and not res.skipped and "1.5x" in res.summary


def test_the_limit_is_the_targets_setting(workspace):
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text() + "\n[perf]\nmax_slowdown = 1.2\n")
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(0.018)}))
    assert not res.ok and "limit 1.2x" in res.summary


def test_no_calibration_means_skipped_not_passed(workspace):
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5)}))
    assert res.skipped and not res.ok and "porter calibrate" in res.summary


def test_a_changed_or_failed_calibration_is_no_baseline(workspace):
    _calibrate(workspace, 0.012, spec_sha="ef" * 32)
    _calibrate(workspace, 0.012, ok=False)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5)}))
    assert res.skipped and not res.ok and "changed or failed" in res.summary


def test_different_timed_cases_are_not_compared(workspace):
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5, case="another case")}))
    assert res.skipped and not res.ok


def test_the_gate_can_be_switched_off_and_then_says_so(workspace):
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text() + "\n[perf]\nenabled = false\n")
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5)}))
    assert res.skipped and not res.ok and "off" in res.summary
