"""The perf gate: a parity-correct candidate far slower than the calibrated known-good code is refused.

The failure it exists for is the failed ds4 port's one-thread-per-output kernel:
right numbers, hundreds of times slower.  Baselines come from `porter calibrate`
ledger records; without one the gate is skipped, never passed.
"""

from __future__ import annotations

import pytest

from porter.records.evidence import load_evidence, store_evidence
from porter.gates import perf
from porter.gates.result import GateResult
from porter.records.ledger import Ledger
from porter.target import load_target
from porter.gates.driver import Candidate, GateContext, ParityOptions

UNIT = "mini_gpu_matmul_q8_0_tensor"
SPEC_SHA = "ab" * 32
CASE = "attn_q 256x256, 64 tokens (prefill)"


REGIME = {"name": "device", "model_hook": "mini_cuda_model_ptr"}


def _parity(median_ms: float, case: str = CASE, spec_sha: str = SPEC_SHA, regime: dict | None = REGIME,
            gpu: str = "NVIDIA H100", arch: str | None = None) -> GateResult:
    return GateResult("parity", True, "parity ok", evidence={
        "candidate_sha256": "cd" * 32, "spec": {"sha256": spec_sha}, "regime": regime, "device": {"name": gpu},
        "timing": {"case": case, "median_ms": median_ms, "gbps": 1.0},
        "toolchain": {"gpu": "test", **({"arch": arch} if arch else {})}})


def _calibrate(ws, median_ms: float, spec_sha: str = SPEC_SHA, ok: bool = True, times: list | None = None,
               regime: dict | None = REGIME, arch: str | None = None, gpu: str = "NVIDIA H100") -> None:
    timing = {"case": CASE, "median_ms": median_ms} | ({"times_ms": times} if times else {})
    ev = store_evidence(ws, {"target": "minimoe", "unit": UNIT, "gate": "parity", "ok": ok, "candidate_sha256": None,
                             "toolchain": {"arch": arch} if arch else {}, "device": {"name": gpu},
                             "regime": regime, "timing": timing})
    Ledger(ws).append("calibration", target="minimoe", unit=UNIT, ok=ok, spec_sha256=spec_sha,
                      known_good="scripted good answers", evidence=ev, summary="")


def test_a_serial_kernel_hundreds_of_times_slower_is_refused(workspace):
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(9.5)}))
    assert not res.ok and not res.skipped
    assert res.summary.startswith("perf failed") and "(792x; limit 2x" in res.summary
    assert res.evidence["baseline"]["median_ms"] == 0.012 and res.evidence["ratio"] > 700
    assert "single thread" in res.diagnostics


def test_a_kernel_near_the_baseline_passes(workspace):
    _calibrate(workspace, 0.012)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(0.018)}))
    assert res.ok and not res.skipped and "1.5x" in res.summary


def test_the_limit_is_the_targets_setting(workspace):
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text() + "\n[perf]\nmax_slowdown = 1.2\n")
    # milliseconds, past the cross-process jitter (a 0.012 ms case 1.5x slower is inside it: the next test)
    _calibrate(workspace, 1.2)
    res = perf.run(Candidate.of(UNIT, ""), GateContext(load_target(workspace, "minimoe"), workspace, results={"parity": _parity(1.8)}))
    assert not res.ok and "limit 1.2x" in res.summary


def test_a_latency_bound_case_past_its_limit_by_less_than_two_processes_differ_passes(workspace):
    """Upstream's own store_raw_kv_batch (0.0183 ms, a spread allowing 1.26x) was refused re-timed in a fresh
    process at 0.0307 ms (1.68x) on a loaded H200 host: the limit from one process's spread does not cover two
    processes.  Past the limit by at most perf.CROSS_PROCESS_JITTER_MS passes, saying so; by more is refused,
    and so is anything slower by a ratio at a size where the jitter is small beside it."""
    times = [0.0183 * (1 + 0.14 * i / 9) for i in range(10)]  # a spread near the one that gave it 1.26x
    _calibrate(workspace, 0.0183, times=times)
    res = _perf(workspace, _parity(0.0307))
    assert res.ok and res.evidence["within_jitter_ms"] > 0 and "within the 0.027 ms" in res.summary, res.summary
    limit = res.evidence["limit"]
    assert res.evidence["ratio"] > limit >= perf.MIN_LIMIT
    past = _perf(workspace, _parity(limit * 0.0183 + perf.CROSS_PROCESS_JITTER_MS + 0.001))
    assert not past.ok and past.check == "slowdown" and past.evidence.get("within_jitter_ms") is None, past.summary
    # a serial kernel on the same case: refused by far
    assert _perf(workspace, _parity(15.6)).check == "slowdown"


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
    ev = store_evidence(ws, {"target": "minimoe", "unit": UNIT, "gate": "parity", "ok": known_good_ok, "regime": REGIME,
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
    from porter.spec import load_specs
    from porter.records.history import History

    target = _ask_for_upstream_baselines(workspace)
    specs = load_specs(target)
    timed = [u for u, s in specs.items() if any(getattr(sh, "timed", False) for sh in s.shapes)]
    untimed = [u for u in specs if u not in timed]
    assert timed and untimed  # minimoe has both: op specs and runtime scenarios
    lib = tmp_path / "libupstream.so"
    lib.write_bytes(b"\x7fELF")
    built, ran = [], []
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: built.append(1) or lib)

    def fake_parity(target, unit, good, opts, **kw):
        ran.append(unit)
        sha = specs[unit].sha256
        return GateResult("parity", True, "parity ok", evidence={
            "target": "minimoe", "gate": "parity", "ok": True, "unit": unit, "spec": {"sha256": sha},
            "timing": {"case": "timed", "median_ms": 0.5, "times_ms": [0.5, 0.5, 0.5, 0.6, 0.7]}})
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
        base = perf.baseline(h, u, specs[u].sha256)[0]
        assert base["median_ms"] == 0.5
        # the limit is recorded with the known-good's evidence, from its own spread: 1 + 2 x (p90 0.7 - 0.5) / 0.5
        ev = load_evidence(workspace, rec.evidence)
        assert ev["perf_limit"]["limit"] == pytest.approx(1.8) and base["perf_limit"] == ev["perf_limit"]
        assert h.calibration_status(u, specs[u].sha256)["calibrated"] is False  # a baseline is no calibration
    ran.clear()
    assert baseline.take_baselines(target, workspace, h, list(specs), ledger, line=lines.append) == {}
    assert ran == []  # taken once


def test_baselines_taken_before_a_run_is_killed_are_kept_and_the_next_run_takes_only_the_rest(
        workspace, monkeypatch, tmp_path):
    """ds4's baseline stage takes minutes; a lease's time box ended one on an H200 host after 33 of 57 were
    timed, and all 33 were lost: they were recorded only once every spec had run.  Each is recorded as it
    lands now."""
    import time as _time

    from porter.calibration import baseline
    from porter.spec import load_specs
    from porter.records.history import History

    target = _ask_for_upstream_baselines(workspace)
    specs = load_specs(target)
    timed = sorted(u for u, s in specs.items() if baseline.times_a_case(s))
    assert len(timed) >= 3
    last = timed[-1]
    lib = tmp_path / "libupstream.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: lib)
    ran = []

    def parity_until_killed(target, unit, good, opts, **kw):
        ran.append(unit)
        if unit == last:
            _time.sleep(0.5)  # the others land first
            raise KeyboardInterrupt  # the run killed while this one ran
        return GateResult("parity", True, "parity ok", evidence={
            "target": "minimoe", "gate": "parity", "ok": True, "unit": unit, "spec": {"sha256": specs[unit].sha256},
            "timing": {"case": "timed", "median_ms": 0.5, "times_ms": [0.5] * 5}})
    monkeypatch.setattr(baseline, "parity_on_library", parity_until_killed)
    with pytest.raises(KeyboardInterrupt):
        baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), timed, Ledger(workspace),
                                line=lambda s: None)
    h = History.read(workspace, "minimoe")
    assert all(perf.baseline(h, u, specs[u].sha256)[0]["median_ms"] == 0.5 for u in timed[:-1])
    assert baseline.missing_baselines(specs, h, timed) == [last]
    ran.clear()
    monkeypatch.setattr(baseline, "parity_on_library", lambda target, unit, good, opts, **kw: ran.append(unit) or
                        GateResult("parity", True, "parity ok", evidence={
                            "target": "minimoe", "gate": "parity", "ok": True, "unit": unit,
                            "spec": {"sha256": specs[unit].sha256}, "timing": {"case": "timed", "median_ms": 0.7}}))
    assert baseline.take_baselines(target, workspace, h, timed, Ledger(workspace), line=lambda s: None) == {last: True}
    assert ran == [last]


@pytest.mark.parametrize("per_gpu", ["1", "4"])
def test_a_baseline_is_a_timed_run_however_many_workers_share_the_gpu(workspace, monkeypatch, tmp_path, per_gpu):
    """With warm workers sharing the GPU a warm run makes no timed call (parity_on_library): a baseline taken
    that way held no timing, and perf judged all 57 ds4 ops by the roofline floor alone (an H200 run, 4
    workers).  The baseline is a fresh child alone on the GPU there; a pass that still timed nothing is not
    recorded, so perf never mistakes it for a comparison and the next run takes it again."""
    from porter.calibration import baseline
    from porter.gates.parity import executors
    from porter.spec import load_specs
    from porter.records.history import History

    monkeypatch.setenv(executors.PER_GPU_ENV, per_gpu)
    target = _ask_for_upstream_baselines(workspace)
    specs = load_specs(target)
    timed = sorted(u for u, s in specs.items() if baseline.times_a_case(s))
    lib = tmp_path / "libupstream.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: lib)
    untimed_pass = timed[0]
    fresh = {}

    def fake_parity(target, unit, good, opts, fresh_process=False, **kw):
        fresh[unit] = fresh_process
        timing = None if unit == untimed_pass else {"case": "timed", "median_ms": 0.5, "times_ms": [0.5] * 5}
        return GateResult("parity", True, "parity ok", evidence={
            "target": "minimoe", "gate": "parity", "ok": True, "unit": unit,
            "spec": {"sha256": specs[unit].sha256}, "timing": timing})
    monkeypatch.setattr(baseline, "parity_on_library", fake_parity)
    lines = []
    got = baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), timed, Ledger(workspace),
                                  line=lines.append)
    assert set(fresh.values()) == {per_gpu != "1"}
    assert got[untimed_pass] is False and all(got[u] for u in timed[1:])
    assert any(f"{untimed_pass}: KNOWN-GOOD RAN UNTIMED" in ln for ln in lines)
    h = History.read(workspace, "minimoe")
    assert h.calibrations(untimed_pass) == [] and perf.baseline(h, untimed_pass, specs[untimed_pass].sha256)[0] is None
    assert all(perf.baseline(h, u, specs[u].sha256)[0]["median_ms"] == 0.5 for u in timed[1:])
    assert baseline.missing_baselines(specs, h, timed) == [untimed_pass]  # the next run takes it again


def test_no_baselines_are_taken_unless_the_target_asks(workspace, monkeypatch):
    from porter.calibration import baseline
    from porter.records.history import History

    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", lambda self: (_ for _ in ()).throw(AssertionError))
    target = load_target(workspace, "minimoe")
    assert baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), list(target.units),
                                   Ledger(workspace)) == {}


def test_an_upstream_that_cannot_build_is_one_line_and_the_run_goes_on(workspace, monkeypatch):
    from porter.calibration import baseline
    from porter.errors import PorterError
    from porter.records.history import History

    def cannot(self):
        raise PorterError("source checkout /nowhere lacks ds4_cuda.cu")
    monkeypatch.setattr(baseline.UpstreamLibraries, "known_good", cannot)
    target = _ask_for_upstream_baselines(workspace)
    lines = []
    assert baseline.take_baselines(target, workspace, History.read(workspace, "minimoe"), list(target.units),
                                   Ledger(workspace), line=lines.append) == {}
    assert lines[-1] == "perf baselines: none taken: source checkout /nowhere lacks ds4_cuda.cu"


# ---- limits calibrated from the known-good's spread; the regime; re-times of suspicious results ----

def _perf(ws, parity: GateResult, target=None):
    return perf.run(Candidate.of(UNIT, ""), GateContext(target or load_target(ws, "minimoe"), ws,
                                                        results={"parity": parity}))


def test_the_limit_comes_from_the_known_goods_own_spread():
    tight = perf.calibrated_limit({"times_ms": [1.00, 1.01, 1.00, 1.02, 1.01, 1.00, 1.01, 1.02, 1.01, 1.03]})
    assert tight["limit"] == perf.MIN_LIMIT and tight["spread"] < 0.05
    noisy = perf.calibrated_limit({"times_ms": [1.0, 1.2, 1.1, 1.4, 1.0, 1.3, 1.1, 1.2, 1.5, 1.1]})
    assert noisy["limit"] == pytest.approx(1 + perf.SPREAD_MARGIN * (1.4 - 1.0) / 1.15, rel=1e-3)
    assert "spread" in noisy["basis"] and noisy["limit"] > tight["limit"]
    unknown = perf.calibrated_limit({"median_ms": 1.0})
    assert unknown["limit"] == perf.FALLBACK_LIMIT and "recalibrate" in unknown["basis"]


def test_the_serial_kernel_that_passed_at_8x_is_refused_by_the_calibrated_limit(workspace):
    """The issue's case: a one-thread-per-row Q8_0 matmul 2.9x slower than upstream, 'perf ok' under the
    picked 8x limit; the known-good's measured spread allows 1.25x."""
    _calibrate(workspace, 12.37, times=[12.30, 12.35, 12.37, 12.36, 12.41, 12.38, 12.33, 12.40, 12.37, 12.39])
    res = _perf(workspace, _parity(36.43))
    assert not res.ok and res.check == "slowdown" and "limit 1.25x" in res.summary, res.summary
    assert res.evidence["limit_basis"].startswith("known-good spread") and res.evidence["regime"] == "device"
    assert _perf(workspace, _parity(13.0)).ok  # within the spread's limit


def test_a_baseline_from_another_regime_or_gpu_is_no_baseline(workspace):
    _calibrate(workspace, 12.37, regime={"name": "host"}, times=[12.3, 12.4, 12.37])
    res = _perf(workspace, _parity(13.0))
    assert res.evidence.get("decided_by") != "known-good" and "regime host" in res.summary, res.summary
    _calibrate(workspace, 12.37, times=[12.3, 12.4, 12.37])
    assert _perf(workspace, _parity(13.0)).evidence["decided_by"] == "known-good"
    other = _perf(workspace, _parity(13.0, gpu="NVIDIA H200"))
    assert other.evidence.get("decided_by") != "known-good" and "NVIDIA H200" in other.summary


def _retimed(median_ms, ok=True, skipped=False, summary="parity ok"):
    return GateResult("parity", ok, summary, skipped=skipped, evidence={"timing": {"case": CASE, "median_ms": median_ms}})


def _retime_answering(asked: list):
    """result -> a stand-in for perf.retime that answers `result` and notes the unit it was asked about."""
    def answer(result):
        def retime(candidate, ctx):
            asked.append(candidate.unit)
            return result
        return retime
    return answer


def test_more_than_10x_faster_than_the_known_good_stands_only_if_a_fresh_retime_agrees(workspace, monkeypatch):
    _calibrate(workspace, 0.5, times=[0.5, 0.5, 0.51])
    asked = []
    answer = _retime_answering(asked)

    monkeypatch.setattr(perf, "retime", answer(_retimed(0.4)))  # fresh process: the honest time shows
    r = _perf(workspace, _parity(0.01))
    assert not r.ok and r.check == "retime" and "0.4 ms" in r.summary and asked == [UNIT], r.summary
    monkeypatch.setattr(perf, "retime", answer(_retimed(None, ok=False, summary="parity failed [timing]: ...")))
    r = _perf(workspace, _parity(0.01))
    assert not r.ok and r.check == "retime" and "failed parity" in r.summary
    monkeypatch.setattr(perf, "retime", answer(_retimed(None, ok=False, skipped=True, summary="parity skipped")))
    assert _perf(workspace, _parity(0.01)).check == "retime"  # no re-time: no belief
    monkeypatch.setattr(perf, "retime", answer(_retimed(0.012)))  # it really is that fast
    r = _perf(workspace, _parity(0.01))
    assert r.ok and r.evidence["retime"]["agrees"] and "re-timed" in r.summary
    asked.clear()
    assert _perf(workspace, _parity(0.2)).ok and asked == []  # 2.5x faster: no suspicion, no re-time


def test_faster_than_the_roofline_is_retimed_too(workspace, monkeypatch):
    monkeypatch.setattr(perf, "retime", lambda c, ctx: _retimed(5.0))
    p = _parity(0.001)
    p.evidence["timing"].update(roofline_ms=0.01, bytes=10**6)
    r = _perf(workspace, p)
    assert not r.ok and r.check == "retime" and "roofline" in r.summary


def test_the_target_declares_the_roofline_floor_per_unit(workspace):
    p = _parity(perf.LAUNCH_ALLOWANCE_MS + 0.03)  # a 0.5 share allows 0.02 ms past the launches, 5% 0.2 ms
    p.evidence["timing"].update(roofline_ms=0.01, bytes=10**6)
    assert _perf(workspace, p).ok
    toml = workspace / "targets" / "minimoe" / "target.toml"
    text = toml.read_text()
    assert "\n[perf]" not in text and text.count("[perf.floors]") == 1  # the routed units' floors
    toml.write_text(text.replace("[perf.floors]\n", f"[perf]\nfloor_fraction = 0.1\n[perf.floors]\n{UNIT} = 0.5\n"))
    r = _perf(workspace, p)
    assert not r.ok and r.check == "floor" and r.evidence["floor_fraction"] == 0.5, r.summary


def test_the_baseline_is_per_architecture(workspace):
    """Issue 32: a known-good time taken on sm_90 is never the baseline of an sm_121 run, even where the two
    GPUs' names say nothing (the same name, or none); the latest calibration on the run's own architecture is."""
    _calibrate(workspace, 12.37, times=[12.3, 12.4, 12.37], arch="sm_90", gpu="NVIDIA GPU")
    on_121 = _perf(workspace, _parity(13.0, gpu="NVIDIA GPU", arch="sm_121"))
    assert on_121.evidence.get("decided_by") != "known-good", on_121.summary
    assert "no known-good timing on sm_121" in on_121.summary, on_121.summary
    assert _perf(workspace, _parity(13.0, gpu="NVIDIA GPU", arch="sm_90")).evidence["decided_by"] == "known-good"
    # a later calibration on sm_121 is its baseline; the sm_90 run keeps its own, older one
    _calibrate(workspace, 40.0, times=[40.0, 40.1, 40.2], arch="sm_121", gpu="NVIDIA GPU")
    mine = _perf(workspace, _parity(41.0, gpu="NVIDIA GPU", arch="sm_121"))
    assert mine.evidence["decided_by"] == "known-good" and mine.evidence["baseline"]["median_ms"] == 40.0
    old = _perf(workspace, _parity(13.0, gpu="NVIDIA GPU", arch="sm_90"))
    assert old.evidence["baseline"]["median_ms"] == 12.37 and old.evidence["baseline"]["arch"] == "sm_90"


def test_comparable_refuses_a_baseline_of_another_architecture():
    base = {"case": CASE, "regime": "device", "arch": "sm_90", "median_ms": 1.0}
    assert perf.comparable(base, {"case": CASE}, "device", None, "sm_121") == "baseline timed on sm_90, candidate on sm_121"
    assert perf.comparable(base, {"case": CASE}, "device", None, "sm_90") == ""
    kg = perf.known_good_baseline(_parity(1.0, arch="sm_90"))[0]
    assert kg["arch"] == "sm_90"


def test_parity_on_several_architectures_is_timed_against_each_ones_own_baseline(workspace):
    """Required sm_90 and sm_121: perf judges each kind's timing against that kind's known-good, and a
    kernel fast on sm_90 but serial-slow on sm_121 is refused, naming sm_121."""
    from porter.gates import archs

    # one calibration across both kinds (gates.archs.across): each kind's own run is its baseline
    kg = {"sm_90": _parity(1.0, arch="sm_90"), "sm_121": _parity(2.0, gpu="NVIDIA GB10", arch="sm_121")}
    for r in kg.values():
        r.evidence["timing"]["times_ms"] = [r.evidence["timing"]["median_ms"]] * 3
    known_good = archs.across(("sm_90", "sm_121"), ("sm_90", "sm_121"), kg.__getitem__, gate="parity")
    ev = store_evidence(workspace, dict(known_good.evidence, target="minimoe", unit=UNIT, gate="parity",
                                        candidate_sha256=None))
    Ledger(workspace).append("calibration", target="minimoe", unit=UNIT, ok=True, spec_sha256=SPEC_SHA,
                             known_good="scripted good answers", evidence=ev, summary="")
    runs = {"sm_90": _parity(1.05, arch="sm_90"), "sm_121": _parity(30.0, gpu="NVIDIA GB10", arch="sm_121")}
    parity = archs.across(("sm_90", "sm_121"), ("sm_90", "sm_121"), runs.__getitem__, gate="parity")
    res = _perf(workspace, parity)
    assert not res.ok and res.check == "slowdown" and res.summary.startswith("[sm_121] perf failed"), res.summary
    per = res.evidence["archs"]
    assert per["sm_90"]["ok"] and per["sm_90"]["evidence"]["baseline"]["median_ms"] == 1.0
    assert per["sm_121"]["evidence"]["baseline"]["median_ms"] == 2.0
    runs["sm_121"] = _parity(2.1, gpu="NVIDIA GB10", arch="sm_121")
    ok = _perf(workspace, archs.across(("sm_90", "sm_121"), ("sm_90", "sm_121"), runs.__getitem__, gate="parity"))
    assert ok.ok and archs.verdicts(ok.evidence) == {"sm_90": True, "sm_121": True}, ok.summary


def test_a_slowdown_stands_only_when_a_fresh_retime_is_slow_too(workspace, monkeypatch):
    """Upstream's own embed_token_hc, 0.0147 ms, was timed at 1.96x against a 1.56x limit once (--jobs 8,
    one H200) and verified on the next attempt: a refusal is confirmed by a re-time in a fresh process."""
    _calibrate(workspace, 12.37, times=[12.30, 12.35, 12.37, 12.36, 12.41, 12.38, 12.33, 12.40, 12.37, 12.39])
    asked = []
    answer = _retime_answering(asked)

    monkeypatch.setattr(perf, "retime", answer(_retimed(36.0)))  # slow again: refused, both times kept
    r = _perf(workspace, _parity(36.43))
    assert not r.ok and r.check == "slowdown" and asked == [UNIT], r.summary
    assert r.evidence["confirmed"]["first"]["median_ms"] == 36.43 and r.evidence["confirmed"]["retime_ok"] is False
    assert r.evidence["candidate"]["median_ms"] == 36.0  # the verdict is the re-time's
    monkeypatch.setattr(perf, "retime", answer(_retimed(12.9)))  # a contended first timing
    r = _perf(workspace, _parity(36.43))
    assert r.ok and "the first timing (36.43 ms on 'attn_q" in r.summary, r.summary
    assert r.evidence["confirmed"]["first"]["median_ms"] == 36.43
    for nothing in (None, _retimed(None, ok=False, summary="parity failed [values]: ..."),
                    _retimed(None, ok=False, skipped=True, summary="parity skipped")):
        monkeypatch.setattr(perf, "retime", answer(nothing))
        r = _perf(workspace, _parity(36.43))
        assert not r.ok and r.check == "slowdown" and "refusal stands" in r.evidence["confirmed"]["detail"]
    other = _retimed(12.9)
    other.evidence["timing"]["case"] = "another case"
    monkeypatch.setattr(perf, "retime", answer(other))
    r = _perf(workspace, _parity(36.43))
    assert not r.ok and "not ['attn_q" in r.evidence["confirmed"]["detail"]
    monkeypatch.setattr(perf, "retime", answer(_retimed(0.5)))  # slow, then 25x faster than upstream
    r = _perf(workspace, _parity(36.43))
    assert not r.ok and r.check == "retime" and "not the same kernel" in r.summary, r.summary
    asked.clear()
    monkeypatch.setattr(perf, "retime", answer(_retimed(0.5)))
    assert _perf(workspace, _parity(13.0)).ok and asked == []  # within the limit: no re-time


# ---- every timed case judged, each against the known-good's time on that case ----------------------

DECODE, PREFILL = "vocab 256->4096, 1 token (decode)", "vocab 256->4096, 129 tokens (prefill)"


def _cases_parity(decode_ms: float, prefill_ms: float, times=None) -> GateResult:
    """A parity result timing two cases; the decode one moves the most bytes (it is what a one-line summary
    names, and what perf alone judged before)."""
    res = _parity(decode_ms, case=DECODE)
    res.evidence["timing"].update(bytes=2_000_000)
    res.evidence["timed_cases"] = [
        dict(res.evidence["timing"], **({"times_ms": [decode_ms * f for f in times]} if times else {})),
        {"case": PREFILL, "median_ms": prefill_ms, "bytes": 1_000_000,
         **({"times_ms": [prefill_ms * f for f in times]} if times else {})}]
    return res


def _calibrate_cases(ws, decode_ms: float, prefill_ms: float):
    spread = [1.0, 1.01, 1.0, 1.02, 1.01, 1.0, 1.01, 1.02, 1.01, 1.0]
    kg = _cases_parity(decode_ms, prefill_ms, spread)
    ev = store_evidence(ws, dict(kg.evidence, target="minimoe", unit=UNIT, gate="parity", ok=True,
                                 candidate_sha256=None))
    Ledger(ws).append("calibration", target="minimoe", unit=UNIT, ok=True, spec_sha256=SPEC_SHA,
                      known_good="scripted good answers", evidence=ev, summary="")


def test_a_kernel_slow_only_in_prefill_is_refused_naming_that_case(workspace, monkeypatch):
    """The issue's answer: a Q8_0 matmul that redoes its whole product once per prefill token, untouched in
    decode, was verified on its first attempt; its judged case was the decode one."""
    _calibrate_cases(workspace, 0.375, 2.0)
    monkeypatch.setattr(perf, "retime", lambda c, ctx: _cases_parity(0.38, 258.0))  # slow again when re-timed
    r = _perf(workspace, _cases_parity(0.38, 258.0))
    assert not r.ok and r.check == "slowdown" and PREFILL in r.summary and "worst of 2 timed cases" in r.summary, \
        r.summary
    rows = {x["case"]: x for x in r.evidence["cases"]}
    assert rows[DECODE]["ok"] and not rows[PREFILL]["ok"] and r.evidence["worst_case"] == PREFILL
    assert rows[PREFILL]["baseline_ms"] == 2.0 and r.evidence["baseline"]["median_ms"] == 2.0
    # both within their own limits: verified, the geomean over both cases recorded
    ok = _perf(workspace, _cases_parity(0.38, 2.05))
    assert ok.ok and ok.evidence["cases_judged"] == 2, ok.summary
    # status shows the case the verdict names, the worst, with the geomean
    shown = perf.speed([dict(_cases_parity(0.38, 258.0).evidence, gate="parity"), dict(r.evidence, gate="perf")])
    assert shown["case"] == PREFILL and shown["time_ms"] == 258.0 and shown["cases_judged"] == 2
    assert "(worst of 2" in perf.speed_cell(shown)
    assert ok.evidence["geomean_ratio"] == pytest.approx(((0.38 / 0.375) * (2.05 / 2.0)) ** 0.5)


def test_a_case_the_known_good_was_never_timed_on_is_judged_by_the_roofline(workspace, monkeypatch):
    """A calibration from before every case was kept has the decode case alone: the prefill case still
    meets the roofline floor, never nothing."""
    kg = _cases_parity(0.375, 2.0)
    kg.evidence["timing"]["times_ms"] = [0.375] * 10
    kg.evidence.pop("timed_cases")  # recorded before every case was kept
    ev = store_evidence(workspace, dict(kg.evidence, target="minimoe", unit=UNIT, gate="parity", ok=True,
                                        candidate_sha256=None))
    Ledger(workspace).append("calibration", target="minimoe", unit=UNIT, ok=True, spec_sha256=SPEC_SHA,
                             known_good="scripted good answers", evidence=ev, summary="")
    cand = _cases_parity(0.38, 5000.0)
    cand.evidence["timed_cases"][1].update(roofline_ms=0.5)  # 5000 ms is far below 5% of that roofline
    monkeypatch.setattr(perf, "retime", lambda c, ctx: cand)
    r = _perf(workspace, cand)
    assert not r.ok and r.check == "floor" and PREFILL in r.summary, r.summary
    assert "no known-good time for" in r.summary
    cand.evidence["timed_cases"][1].pop("roofline_ms")  # no roofline either: named, not judged
    r = _perf(workspace, cand)
    assert r.ok and "not judged, no baseline or roofline: " + PREFILL in r.summary, r.summary
    assert {x["case"]: x["decided_by"] for x in r.evidence["cases"]} == {DECODE: "known-good", PREFILL: None}


def test_cases_of_reads_old_and_new_evidence():
    old = {"timing": {"case": "a", "median_ms": 1.0}}
    assert list(perf.cases_of(old)) == ["a"]
    new = {"timing": {"case": "b", "median_ms": 2.0},
           "timed_cases": [{"case": "a", "median_ms": 1.0}, {"case": "b", "median_ms": 2.0}, {"case": "c"}]}
    assert list(perf.cases_of(new)) == ["a", "b"]  # an untimed entry is no case
    assert perf.cases_of(None) == {} and perf.cases_of({"timing": None}) == {}
