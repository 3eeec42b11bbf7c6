"""Calibration chunks (porter/calibration/chunks.py): every spec once, work balanced, bad chunks refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.calibration.chunks import main, parse_chunk, split
from porter.errors import PorterError

REPO = Path(__file__).resolve().parents[1]


def test_every_unit_lands_in_exactly_one_chunk_and_the_work_is_balanced():
    weights = {f"u{i}": w for i, w in enumerate([40, 9, 9, 8, 7, 5, 3, 3, 2, 1, 1, 1, 1])}
    chunks = split(weights, 3)
    flat = [u for c in chunks for u in c]
    assert sorted(flat) == sorted(weights) and len(flat) == len(set(flat))
    loads = [sum(weights[u] for u in c) for c in chunks]
    assert max(loads) == 40  # the one heavy spec alone bounds the schedule; the others share the rest
    assert sorted(loads)[:2] == [25, 25]


def test_one_chunk_is_everything_and_more_chunks_than_units_leave_some_empty():
    weights = {"a": 1, "b": 2}
    assert split(weights, 1) == [["a", "b"]]
    assert sorted(map(len, split(weights, 4))) == [0, 0, 1, 1]


@pytest.mark.parametrize("bad", ["0/3", "4/3", "3", "a/b", "1/0"])
def test_a_malformed_chunk_is_refused(bad):
    with pytest.raises(PorterError, match="expected i/n"):
        parse_chunk(bad)


def test_the_command_gives_one_line_and_exit_2_on_a_bad_chunk(capsys):
    assert main(["-C", str(REPO), "--target", "minimoe", "5/2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected i/n" in err


def test_the_command_prints_unit_flags_for_minimoe(capsys):
    from porter.spec import load_specs
    from porter.target import load_target

    outs = []
    for i in (1, 2):
        assert main(["-C", str(REPO), "--target", "minimoe", f"{i}/2"]) == 0
        outs += capsys.readouterr().out.split()
    units = [x for x in outs if x != "--unit"]
    assert sorted(units) == sorted(load_specs(load_target(REPO, "minimoe")))


def test_porter_calibrate_chunk_runs_that_chunk_of_the_specs(monkeypatch, capsys):
    import porter.calibration.command as command
    from porter.calibration.chunks import chunk_units
    from porter.cli import main
    from porter.target import load_target

    seen = []
    monkeypatch.setattr(command, "calibrate", lambda target, libs, opts, out=print: seen.append(opts.units) or
                        {"rows": [], "seconds": 0.0})
    args = ["-C", str(REPO), "calibrate", "--target", "minimoe", "--mode", "host", "--no-ledger"]
    assert main(args + ["--chunk", "2/3"]) == 0
    assert seen == [chunk_units(load_target(REPO, "minimoe"), "2/3")] and seen[0]
    assert main(args + ["--chunk", "3/2"]) == 2
    assert "expected i/n" in capsys.readouterr().err
    # with --unit: the chunk is taken of those units only
    assert main(args + ["--unit", "mini_gpu_add_tensor", "--chunk", "1/1"]) == 0
    assert seen[-1] == ["mini_gpu_add_tensor"]


class StandInLibs:
    """calibrate()'s library builder without a compiler: the known-good is good.so, a mutant
    <name>@<the check it must fail by>.so (what the stand-in parity runs read)."""

    describe = "stand-in"

    def __init__(self, folder: Path):
        self.folder = folder

    def prepare(self, mutants, progress=None):
        pass

    def known_good(self):
        return self.folder / "good.so"

    def has(self, unit):
        return True

    def mutant(self, m):
        return self.folder / f"{m.name}@{m.must_fail_check}.so"


def test_calibrate_starts_the_heaviest_units_first_and_reports_in_the_units_order(monkeypatch, tmp_path):
    """One command over a whole target (--executor ray: --jobs is the cluster's GPUs): units go to the
    slots longest first, as --chunk balanced them across runs; the report keeps the units' order."""
    import porter.calibration.calibrator as calibrator
    from porter.calibration.calibrator import CalibrateOptions, Row, calibrate, calibration_runs, select_mutants
    from porter.gates.driver import ParityOptions
    from porter.target import load_target

    target = load_target(REPO, "minimoe")
    started = []

    def fake_unit(target, libs, opts, good, plan, mutants, specs, unit, emit):
        started.append(unit)
        return [Row(unit, "known-good", "-", "pass", "pass", True, "")], {"ok": True}

    monkeypatch.setattr(calibrator, "_calibrate_unit", fake_unit)
    units = sorted(__import__("porter.spec", fromlist=["load_specs"]).load_specs(target))
    opts = CalibrateOptions(tmp_path, units, None, True, ParityOptions(mode="host"), ledger=False, jobs=1)
    report = calibrate(target, StandInLibs(tmp_path), opts, out=lambda *a: None)
    mutants = select_mutants(target, StandInLibs(tmp_path), units, opts)
    runs = {u: calibration_runs(u, None, mutants) for u in units}
    assert len(set(runs.values())) > 1, "every unit weighs the same: the order would prove nothing"
    assert started == sorted(units, key=lambda u: (-runs[u], units.index(u)))
    assert [r["unit"] for r in report["rows"]] == units


def test_one_specs_mutants_spread_over_the_run_slots_and_never_more_runs_than_jobs(tmp_path, monkeypatch):
    """A chunk's wall time was one heavy spec's, its mutants run one after another while another GPU
    idled (two H200s through Ray): a spec's variants and mutants now share the --jobs run slots with
    every other unit's runs.  At most --jobs runs are in flight (each holds its inputs in host memory),
    the known-good run comes before its unit's mutants (their perf baseline), and the rows are those of
    one run at a time."""
    import threading

    import porter.calibration.calibrator as calibrator
    from porter.calibration.calibrator import CalibrateOptions, calibrate
    from porter.gates.driver import ParityOptions
    from porter.gates.result import GateResult
    from porter.target import load_target

    target = load_target(REPO, "minimoe")
    lock = threading.Condition()
    state = {"now": 0, "most": 0, "per_unit": {}, "good_done": set(), "order_bad": [], "jobs": 1, "calls": 0,
             "total": None, "by_unit": {}}

    def fake_parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False):
        mutant = Path(lib).name != "good.so"
        with lock:
            if mutant and unit not in state["good_done"]:
                state["order_bad"].append(unit)
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            per = state["per_unit"].setdefault(unit, [0, 0])
            per[0] += 1
            per[1] = max(per[1], per[0])
            state["calls"] += 1
            state["by_unit"][unit] = state["by_unit"].get(unit, 0) + 1
            lock.notify_all()
            # hold the slot until every slot is taken (or no call is left to take one): overlap by
            # construction, not by a sleep that a loaded machine may not honour; the timeout only ends a
            # wait the order of the runs makes impossible
            lock.wait_for(lambda: state["now"] >= state["jobs"] or state["calls"] == state["total"], timeout=2)
        with lock:
            state["now"] -= 1
            state["per_unit"][unit][0] -= 1
            if not mutant:
                state["good_done"].add(unit)
        if mutant:  # refused by the check the mutant's name ends in
            check = Path(lib).stem.rsplit("@", 1)[1]
            return GateResult("parity", False, f"parity failed [{check}]", check=check,
                              metrics={"failed_checks": [check]})
        return GateResult("parity", True, "parity ok")

    monkeypatch.setattr(calibrator, "parity_on_library", fake_parity)
    units = ["mini_gpu_matmul_q8_0_tensor", "mini_gpu_swiglu_tensor", "mini_gpu_add_tensor"]

    def rows(jobs, which=units):
        opts = CalibrateOptions(tmp_path, which, None, True, ParityOptions(mode="host"), show_static=False,
                                ledger=False, jobs=jobs)
        report = calibrate(target, StandInLibs(tmp_path), opts, out=lambda *a: None)
        return [(r["unit"], r["kind"], r["name"], r["got"], r["ok"]) for r in report["rows"]]

    one = rows(1)
    assert state["most"] == 1
    state.update(jobs=3, total=state["calls"], calls=0)
    n_q8 = sum(1 for r in one if r[0] == "mini_gpu_matmul_q8_0_tensor")
    assert n_q8 > 3, "the heavy unit has too few mutants to show anything"
    state.update(most=0, per_unit={}, good_done=set())
    assert rows(3) == one
    assert state["most"] == 3  # the slots filled, never more
    assert not state["order_bad"], f"a mutant ran before its unit's known-good: {state['order_bad']}"
    # one spec's mutants side by side: the heavy unit alone (with the others, which unit a freed slot goes
    # to is the semaphore's choice; alone, its mutants are all there is to fill the slots)
    heavy = "mini_gpu_matmul_q8_0_tensor"
    # by_unit counted both runs above: one run of the heavy unit is half of it
    state.update(jobs=3, total=state["by_unit"][heavy] // 2, calls=0, most=0, per_unit={}, good_done=set())
    assert rows(3, [heavy]) == [r for r in one if r[0] == heavy]
    assert state["per_unit"][heavy][1] == 3 and not state["order_bad"]
