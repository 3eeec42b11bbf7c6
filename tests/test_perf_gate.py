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


# ---- baselines a run takes from the upstream backend ([perf] baseline = "upstream") ----------

def _baseline_record(ws, median_ms: float, known_good_ok: bool):
    ev = store_evidence(ws, {"target": "minimoe", "unit": UNIT, "gate": "parity", "ok": known_good_ok,
                             "candidate_sha256": None, "toolchain": {}, "timing": {"case": CASE, "median_ms": median_ms}})
    Ledger(ws).append("calibration", target="minimoe", unit=UNIT, ok=False, known_good_ok=known_good_ok,
                      spec_sha256=SPEC_SHA, known_good="upstream", evidence=ev, mutants=0, summary="baseline only")


def test_a_known_good_baseline_decides_though_it_is_no_calibration(workspace):
    _baseline_record(workspace, 0.012, known_good_ok=True)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace,
                                                       results={"parity": _parity(9.5)}))
    assert not res.ok and not res.skipped and res.evidence["decided_by"] == "known-good"


def test_a_known_good_that_failed_its_spec_is_no_baseline(workspace):
    _baseline_record(workspace, 0.012, known_good_ok=False)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace,
                                                       results={"parity": _parity(9.5)}))
    assert res.skipped and not res.ok


def _ask_for_upstream_baselines(ws):
    toml = ws / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text() + '\n[perf]\nbaseline = "upstream"\n')
    return load_target(ws, "minimoe")


def test_a_run_takes_each_missing_baseline_once_and_records_it_as_no_calibration(workspace, monkeypatch, tmp_path):
    from porter.calibration import baseline
    from porter.gates.parity.spec import load_specs
    from porter.history import History

    target = _ask_for_upstream_baselines(workspace)
    specs = load_specs(target)
    timed = [u for u, s in specs.items() if any(getattr(sh, "timed", False) for sh in s.shapes)]
    untimed = [u for u in specs if u not in timed]
    assert timed and untimed  # minimoe has both: op specs and runtime scenarios
    lib = tmp_path / "libupstream.so"
    lib.write_bytes(b"\x7fELF")
    built, ran = [], []
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: built.append(1) or lib)

    def fake_parity(target, unit, good, opts):
        ran.append(unit)
        sha = specs[unit].sha256
        return GateResult("parity", True, "parity ok", evidence={
            "target": "minimoe", "gate": "parity", "ok": True, "unit": unit, "spec": {"sha256": sha},
            "timing": {"case": "timed", "median_ms": 0.5}})
    monkeypatch.setattr(baseline, "parity_on_library", fake_parity)
    ledger = Ledger(workspace)
    lines = []
    got = baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), list(specs), ledger,
                                  line=lines.append)
    assert sorted(got) == sorted(timed) and all(got.values()) and sorted(ran) == sorted(timed)
    assert built == [1] and any("building the upstream" in ln for ln in lines)
    h = History.read(workspace, "minimoe")
    for u in timed:
        rec = h.calibrations(u)[-1]
        assert rec.ok is False and rec.known_good_ok is True and rec.mutants == 0
        assert perf.baseline(h, u, specs[u].sha256)[0]["median_ms"] == 0.5
        assert h.calibration_status(u, specs[u].sha256)["calibrated"] is False  # a baseline is no calibration
    ran.clear()
    assert baseline.take_baselines(target, workspace, h, list(specs), ledger, line=lines.append) == {}
    assert ran == []  # taken once


def test_no_baselines_are_taken_unless_the_target_asks(workspace, monkeypatch):
    from porter.calibration import baseline
    from porter.history import History

    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: (_ for _ in ()).throw(AssertionError))
    target = load_target(workspace, "minimoe")
    assert baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), list(target.units),
                                   Ledger(workspace)) == {}


def test_an_upstream_that_cannot_build_is_one_line_and_the_run_goes_on(workspace, monkeypatch):
    from porter.calibration import baseline
    from porter.errors import PorterError
    from porter.history import History

    def cannot(self):
        raise PorterError("source checkout /nowhere lacks ds4_cuda.cu")
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", cannot)
    target = _ask_for_upstream_baselines(workspace)
    lines = []
    assert baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), list(target.units),
                                   Ledger(workspace), line=lines.append) == {}
    assert lines[-1] == "perf baselines: none taken: source checkout /nowhere lacks ds4_cuda.cu"
