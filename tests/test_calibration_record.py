"""calibrate's ledger records: a known-good run that was skipped (a spec error, measured on an H100 as a
half-written fixture) is recorded as not calibrated, with no evidence, and never crashes the command
(run_gates gives every result a candidate_sha256, so a skipped run's evidence is not empty)."""

from pathlib import Path
from types import SimpleNamespace

from porter.calibration import calibrator
from porter.gates.result import GateResult
from porter.records.history import History
from porter.records.ledger import Ledger
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
    from porter.gates.mutants import Mutant

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
    from porter.gates.mutants import Mutant

    rows, _, calls = _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms=0.01, retimed_ms=3.0)
    assert rows[-1].got == "retime" and ("mutant.so", True) in calls
    assert Mutant(UNIT, "x", "retime", "", "rules").perf and not Mutant(UNIT, "x", "timing", "", "rules").perf


# --- a calibration holds for the mutants it ran: one added or changed since, or a subset run, is none ---

def _record_calibration(ws: Path, ran) -> str:
    """A passing calibration of UNIT's current spec that ran the mutants `ran`, as calibrate records it."""
    from porter.gates.mutants import digest_of
    from porter.spec import load_spec

    target = load_target(ws, "minimoe")
    spec = load_spec(target, UNIT)
    rec = {"ok": True, "summary": "ok", "known_good_ok": True, "mutants": len(ran), "mutants_rejected": len(ran),
           "mutant_digests": {m.name: digest_of(m) for m in ran}, "mutant_scope": "all", "evidence": None,
           "spec": spec}
    (ws / "lib.so").write_bytes(b"stand-in")
    calibrator.record(target, ws, {UNIT: rec}, "stand-in", ws / "lib.so", ledger=Ledger.open(ws))
    return spec.sha256


def _status(ws: Path, sha: str) -> dict:
    from porter.gates.mutants import current_digests

    target = load_target(ws, "minimoe")
    return History.read(ws, "minimoe").calibration_status(UNIT, sha, current_digests(target, UNIT))


def test_calibrate_records_the_mutants_it_ran(tmp_path, monkeypatch):
    from porter.gates.mutants import digest_of

    rows, rec, _ = _perf_mutant_rows(tmp_path, monkeypatch, mutant_ms=3.0)
    (m_name, digest), = rec["mutant_digests"].items()
    assert m_name == "serial" and len(digest) == 64 and rec["mutant_scope"] == "all"
    from porter.gates.mutants import Mutant
    assert digest == digest_of(Mutant(UNIT, "serial", "slowdown", "one thread does everything", "rules", file="x.cu"))


def test_a_mutant_added_after_calibration_leaves_the_spec_uncalibrated(workspace):
    from porter.gates.mutants import load_mutants

    target = load_target(workspace, "minimoe")
    mine = [m for m in load_mutants(target) if m.unit == UNIT]
    assert len(mine) >= 3
    sha = _record_calibration(workspace, mine)
    assert _status(workspace, sha)["calibrated"] is True
    manifest = workspace / "targets" / "minimoe" / "adversarial" / "manifest.toml"
    (manifest.parent / "swiglu_new.cu").write_text((manifest.parent / "swiglu_untouched.cu").read_text())
    manifest.write_text(manifest.read_text() + '\n[[mutant]]\nunit = "%s"\nfile = "swiglu_new.cu"\n'
                        'must_fail_check = "sentinel"\nwhy = "added after the calibration"\n' % UNIT)
    st = _status(workspace, sha)
    assert st["calibrated"] is False and "swiglu_new" in st["reason"], st


def test_a_changed_mutant_or_a_subset_run_is_no_calibration(workspace):
    from porter.gates.mutants import load_mutants

    target = load_target(workspace, "minimoe")
    mine = [m for m in load_mutants(target) if m.unit == UNIT]
    sha = _record_calibration(workspace, mine[:1])  # `porter calibrate --mutant NAME`: one of them
    st = _status(workspace, sha)
    assert st["calibrated"] is False and mine[1].name in st["reason"], st
    sha = _record_calibration(workspace, mine)  # all of them: calibrated again
    assert _status(workspace, sha)["calibrated"] is True
    bad = workspace / "targets" / "minimoe" / "adversarial" / "swiglu_untouched.cu"
    bad.write_text(bad.read_text() + "\n/* edited: no longer the code the calibration ran */\n")
    st = _status(workspace, sha)
    assert st["calibrated"] is False and "swiglu_untouched" in st["reason"], st
