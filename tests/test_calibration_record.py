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
