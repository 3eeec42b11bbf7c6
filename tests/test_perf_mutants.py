"""The perf mutant corpus: correct-but-slow kernels and timing hacks beside the parity mutants, each naming
the check that must refuse it (calibration runs perf on the ones that pass parity: test_calibration_record)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import NO_DS4

from porter.gates.mutants import load_mutants, rule_mutants
from porter.gates.perf import PERF_CHECKS
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
CHECKOUT = REPO / "external" / "ds4"


@pytest.fixture
def ds4(tmp_path):
    (tmp_path / "ds4_gpu.h").write_text("")  # only our own files are read
    return load_target(REPO, "ds4", tmp_path)


def test_ds4_has_slow_kernels_and_timing_hacks_each_with_its_check(ds4):
    perf = {m.name: m for m in rule_mutants(ds4) if m.perf or m.name.startswith(("add-skips", "q8_0-decode"))}
    assert {m.must_fail_check for m in perf.values()} >= {"slowdown", "timing"}
    assert "q8_0-decode-one-thread-per-row" in perf  # the failed port's kernel
    assert "q8_0-decode-slow-replays-unchanged-inputs" in perf  # the replay hack, over a slow kernel
    for m in perf.values():
        assert m.must_fail_check in PERF_CHECKS + ("timing",), m.name
        assert all("porter mutant (perf)" in r.replace for r in m.rules[:1]), m.name


@pytest.mark.skipif(not (CHECKOUT / "ds4_cuda.cu").is_file(), reason=NO_DS4)
def test_every_ds4_perf_mutant_applies_once_to_the_checkout(tmp_path):
    target = load_target(REPO, "ds4", CHECKOUT)
    src = (CHECKOUT / "ds4_cuda.cu").read_text()
    for m in rule_mutants(target):
        if m.perf:
            assert m.apply(src) != src


def test_minimoe_scripted_slow_answer_and_replay_mutant_are_perf_mutants():
    target = load_target(REPO, "minimoe")
    muts = {m.name: m for m in load_mutants(target)}
    assert muts["bad/matmul_q8_0_serial.md"].must_fail_check == "slowdown"  # was "pass": parity only
    assert muts["matmul_q8_0_serial_replays.cu"].perf
    assert muts["matmul_q8_0_skip_when_timed.cu"].must_fail_check == "timing"


@pytest.mark.parametrize("per_gpu", ["1", "4"])
def test_the_perf_table_judges_the_known_good_against_itself_and_every_perf_mutant(tmp_path, monkeypatch, per_gpu):
    """`porter dev perf-table` (the GPU must-show in one command), with the parity runs faked: the known-good
    re-timed in a fresh process passes its own calibrated limit, the host regime is measured beside it, a
    slow perf mutant is refused by 'slowdown', and the table says so.  With warm workers sharing the GPU a
    warm run makes no timed call (faked so here too): every run the table times is then a fresh child."""
    from types import SimpleNamespace

    from porter.calibration import calibrator, perf_table
    from porter.calibration.calibrator import CalibrateOptions
    from porter.gates.mutants import Mutant
    from porter.gates.parity import executors
    from porter.gates.result import GateResult

    monkeypatch.setenv(executors.PER_GPU_ENV, per_gpu)
    target = load_target(REPO, "minimoe")
    unit = "mini_gpu_matmul_q8_0_tensor"
    ran = []

    def parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False):
        regime = opts.parity.regime or "device"
        ran.append((Path(lib).name, regime, fresh_process))
        ms = {"good.so": 1.0 if regime == "device" else 30.0, "slow.so": 4.0}[Path(lib).name]
        timed = fresh_process or per_gpu == "1"
        return GateResult("parity", True, "parity ok", evidence={
            "regime": {"name": regime}, "device": {"name": "NVIDIA H100"},
            "timing": {"case": "c", "median_ms": ms, "times_ms": [ms, ms * 1.01, ms * 0.99],
                       "roofline_ms": 0.5} if timed else None})

    monkeypatch.setattr(perf_table, "parity_on_library", parity)
    monkeypatch.setattr(calibrator, "parity_on_library", parity)
    opts = CalibrateOptions(tmp_path, [unit], ledger=False, variants=False)
    row, first, seeds = perf_table.measure_unit(target, unit, tmp_path / "good.so", opts, ["host"])
    assert row["perf"] == "pass" and row["pct_roofline"] == 50.0 and row["host_pct_roofline"] == pytest.approx(5 / 3)
    assert row["suggested_floor"] == 0.25 and ("good.so", "device", True) in ran  # re-timed in a fresh process
    slow = Mutant(unit, "serial", "slowdown", "one thread", "rules", file="x.cu")
    libs = SimpleNamespace(mutant=lambda m: tmp_path / "slow.so")
    m = perf_table.judge_mutant(target, slow, libs, opts, first, seeds)
    assert m["got"] == "slowdown" and m["ok"]
    text = perf_table.render(target, [row], [m], ["host"], 12.0, "NVIDIA H100")
    assert "| matmul_q8_0_tensor | c | 1 | 50.0 |" in text and "| serial | matmul_q8_0_tensor | slowdown | slowdown | yes |" in text
    assert "passes perf in the device regime on 1 of 1 timed ops; 1 of 1 perf mutants refused" in text


def test_the_perf_table_lists_the_declared_perf_mutants_it_never_judged(monkeypatch):
    """A table cut short by its time box judged some perf mutants: it must not read '1 of 1 refused'
    when the target declares three for the ops it shows."""
    from porter.calibration import perf_table
    from porter.gates.mutants import Mutant

    target = load_target(REPO, "minimoe")
    unit = "mini_gpu_matmul_q8_0_tensor"
    declared = [Mutant(unit, "serial", "slowdown", "one thread", "rules", file="x.cu"),
                Mutant(unit, "per-token", "slowdown", "one launch per token", "rules", file="x.cu"),
                Mutant(unit, "skip-timed", "timing", "skips repeats", "rules", file="x.cu"),
                Mutant("mini_gpu_add_tensor", "add-serial", "slowdown", "not a tabled op", "rules", file="y.cu")]
    monkeypatch.setattr(perf_table, "perf_rule_mutants", lambda t: declared)
    row = {"unit": unit, "known_good": "pass", "perf": "pass", "case": "c", "ms": 1.0}
    judged = {"unit": unit, "mutant": "serial", "expect": "slowdown", "got": "slowdown", "ok": True}
    text = perf_table.render(target, [row], [judged], [], 1.0, "NVIDIA H100")
    assert "| per-token | matmul_q8_0_tensor | slowdown | not judged | - |" in text
    assert "| skip-timed | matmul_q8_0_tensor | timing | not judged | - |" in text
    assert "add-serial" not in text  # its op is not in this table
    assert "1 of 1 perf mutants refused by the check they name; 2 declared perf mutant(s) not judged here" in text
    full = perf_table.render(target, [row], [judged, dict(judged, mutant="per-token"),
                                             dict(judged, mutant="skip-timed", expect="timing", got="timing")],
                             [], 1.0, "NVIDIA H100")
    assert "not judged" not in full and "3 of 3 perf mutants refused by the check they name\n" in full
