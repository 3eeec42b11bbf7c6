"""calibrate's ledger records: a known-good run that was skipped (a spec error, measured on an H100 as a
half-written fixture) is recorded as not calibrated, with no evidence, and never crashes the command
(run_gates gives every result a candidate_sha256, so a skipped run's evidence is not empty)."""

from pathlib import Path
from types import SimpleNamespace

from porter.calibration import calibrator
from porter.gates.result import GateResult
from porter.history import History
from porter.ledger import Ledger
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_swiglu_tensor"


def test_a_skipped_known_good_run_is_recorded_uncalibrated_without_evidence(tmp_path, monkeypatch):
    target = load_target(REPO, "minimoe")
    skipped = GateResult("parity", False, "parity skipped: spec error: building inputs failed", skipped=True,
                         evidence={"candidate_sha256": "0" * 64})
    monkeypatch.setattr(calibrator, "parity_on_library", lambda *a, **k: skipped)
    libs = SimpleNamespace(has=lambda unit: True, describe="stand-in")
    spec = SimpleNamespace(sha256="1" * 64, path=None)
    opts = calibrator.CalibrateOptions(tmp_path, with_mutants=False, variants=False)
    rows, rec = calibrator._unit_runs(target, libs, opts, tmp_path / "lib.so", None, [], {UNIT: spec}, UNIT,
                                      lambda line: None)
    assert rec["ok"] is False and rec["evidence"] is None
    (tmp_path / "lib.so").write_bytes(b"not a library")
    ledger = Ledger.open(tmp_path)
    calibrator.record(target, tmp_path, {UNIT: rec}, "stand-in", tmp_path / "lib.so", ledger=ledger)
    cal = History.read(tmp_path, target.name).calibrations(UNIT)
    assert len(cal) == 1 and not cal[0].ok and cal[0].evidence is None


def _timed(median_ms: float, times: list[float]) -> GateResult:
    return GateResult("parity", True, "parity ok", evidence={
        "candidate_sha256": "0" * 64, "regime": {"name": "device"}, "device": {"name": "NVIDIA H100"},
        "timing": {"case": "timed", "median_ms": median_ms, "times_ms": times}})


def _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms: float, retimed_ms: float | None = None):
    """A perf mutant through calibration: the known-good timed once (tight spread), the mutant passing parity
    at `mutant_ms`, its fresh-process re-time (if asked) at `retimed_ms`."""
    from porter.calibration.mutants import Mutant

    target = load_target(REPO, "minimoe")
    calls = []

    def parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False):
        calls.append((Path(lib).name, fresh_process))
        if Path(lib).name == "good.so":
            return _timed(1.0, [1.0, 1.01, 0.99, 1.0, 1.02])
        return _timed(retimed_ms if fresh_process else mutant_ms, [mutant_ms] * 5)

    monkeypatch.setattr(calibrator, "parity_on_library", parity)
    libs = SimpleNamespace(has=lambda unit: True, describe="stand-in", mutant=lambda m: tmp_path / "mutant.so")
    spec = SimpleNamespace(sha256="1" * 64, path=None)
    m = Mutant(UNIT, "serial", "slowdown", "one thread does everything", "rules", file="x.cu")
    opts = calibrator.CalibrateOptions(tmp_path, with_mutants=True, variants=False, show_static=False)
    rows, rec = calibrator._unit_runs(target, libs, opts, tmp_path / "good.so", None, [m], {UNIT: spec}, UNIT,
                                      lambda line: None)
    return rows, rec, calls


def test_a_correct_but_slow_perf_mutant_is_refused_by_the_perf_gate(tmp_path, monkeypatch):
    """Parity accepts it (right numbers); calibration then judges it against the known-good run it just made,
    with the limit that run's spread allows: 3x slower is refused by 'slowdown', and so the spec's perf is
    calibrated.  Before perf mutants, such an answer only had to pass parity."""
    rows, rec, _ = _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms=3.0)
    row = rows[-1]
    assert row.got == "slowdown" and row.ok and rec["mutants_rejected"] == 1, row
    rows, rec, _ = _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms=1.1)  # as fast as the known-good
    assert rows[-1].got == "pass" and not rows[-1].ok and rec["mutants_rejected"] == 0


def test_a_timing_hack_too_fast_to_believe_is_retimed_in_a_fresh_process(tmp_path, monkeypatch):
    from porter.calibration.mutants import Mutant

    rows, _, calls = _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms=0.01, retimed_ms=3.0)
    assert rows[-1].got == "retime" and ("mutant.so", True) in calls
    assert Mutant(UNIT, "x", "retime", "", "rules").perf and not Mutant(UNIT, "x", "timing", "", "rules").perf
