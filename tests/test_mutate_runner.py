"""Distinct mutants through parity and perf (porter/calibration/mutate/runner.py), on the calibration's own
functions (calibrator.parity_on_library, perf_on_mutant) replaced by stand-ins here; the GPU run is
test_mutate_command.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

import porter.calibration.calibrator as calibrator
from porter.calibration.calibrator import CalibrateOptions
from porter.calibration.libraries import BuildError
from porter.calibration.mutate import runner
from porter.calibration.mutate.generate import Mutation
from porter.calibration.mutate.objects import DISTINCT, DUPLICATE, Built
from porter.gates.driver import ParityOptions
from porter.gates.result import GateResult


def built(unit: str, tag: str, status: str = DISTINCT) -> Built:
    m = Mutation(unit, "arith", 1, 1, "k", "kernel", "+", "-", tag, tag.ljust(12, "0"), f"// {tag}\n")
    return Built(m, status, digest=tag)


class Libs:
    """Stand-in library builder: a mutant's 'library' is named after its note; 'nolink' does not link."""

    def known_good(self):
        return Path("good.so")

    def mutant(self, m):
        if m.why == "nolink":
            raise BuildError("link of x failed: undefined symbol foo")
        return Path(f"{m.why}.so")


VERDICTS = {  # library -> what parity says of it
    "good.so": GateResult("parity", True, "parity ok", evidence={"timing": {"median_ms": 1.0}}),
    "wrong.so": GateResult("parity", False, "parity failed [nmse]", check="nmse"),
    "hang.so": GateResult("parity", False, "timed out", check="timeout"),
    "slow.so": GateResult("parity", True, "parity ok (slow)", evidence={"timing": {"median_ms": 9.0}}),
    "same.so": GateResult("parity", True, "parity ok", evidence={"timing": {"median_ms": 1.0}}),
    "skip.so": GateResult("parity", False, "spec error", skipped=True),
}


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False):
        seen.append((unit, Path(lib).name, timeout, tuple(seeds or ())))
        return VERDICTS[Path(lib).name]

    def perf(target, unit, parity_res, known_good, retime):
        slow = parity_res.evidence["timing"]["median_ms"] > 2 * known_good.evidence["timing"]["median_ms"]
        return GateResult("perf", not slow, "perf refused: 9x" if slow else "perf ok",
                          check="slowdown" if slow else None)

    monkeypatch.setattr(calibrator, "parity_on_library", parity)
    monkeypatch.setattr(calibrator, "perf_on_mutant", perf)
    return seen


def opts(tmp_path, jobs=1, screen=False):
    return CalibrateOptions(tmp_path, None, None, True, ParityOptions(mode="host", timeout=120.0), ledger=False,
                            jobs=jobs, mutation_screen=screen)


def test_each_mutant_is_killed_by_its_check_perf_where_parity_passed_or_survives(calls, tmp_path):
    bs = [built("u", t) for t in ("wrong", "hang", "slow", "same", "skip", "nolink")] + \
        [built("u", "dup", DUPLICATE)]
    facts, results = runner.run_all(None, Libs(), bs, ["u"], opts(tmp_path, jobs=3), out=lambda *a: None)
    got = {r["id"][:4].rstrip("0"): (r["outcome"], r.get("check")) for r in results.values()}
    assert got == {"wron": ("killed", "nmse"), "hang": ("killed", "timeout"), "slow": ("killed", "slowdown"),
                   "same": ("survived", None), "skip": ("not-run", None), "noli": ("did-not-build", None)}
    assert facts["u"]["ok"] and facts["u"]["word"] == "pass"
    assert [c[1] for c in calls][0] == "good.so", "the known-good runs first: the perf baseline"
    assert "dup.so" not in [c[1] for c in calls], "a duplicate is never run"
    assert len({c[3] for c in calls}) == 1, "every run of a unit shares the known-good's seeds"


def test_a_mutants_time_limit_is_a_few_known_good_runs_never_the_specs_whole_limit(calls, tmp_path):
    runner.run_all(None, Libs(), [built("u", "wrong")], ["u"], opts(tmp_path), out=lambda *a: None)
    limit = next(c[2] for c in calls if c[1] == "wrong.so")
    assert limit == runner.MIN_TIMEOUT_S  # the stand-in known-good took no time
    assert runner.mutant_timeout(20.0, 120.0) == 100.0 and runner.mutant_timeout(60.0, 120.0) == 120.0


def test_a_refused_known_good_leaves_its_mutants_unjudged(calls, tmp_path, monkeypatch):
    monkeypatch.setitem(VERDICTS, "good.so", GateResult("parity", False, "parity failed [nmse]", check="nmse"))
    facts, results = runner.run_all(None, Libs(), [built("u", "wrong"), built("u", "same")], ["u"], opts(tmp_path),
                                    out=lambda *a: None)
    assert not facts["u"]["ok"]
    assert {r["outcome"] for r in results.values()} == {"not-run"}
    assert all("known-good was refused (nmse)" in r["error"] for r in results.values())
    assert [c[1] for c in calls] == ["good.so"], "no mutant ran against a spec that refuses correct code"


def test_units_run_side_by_side_and_each_keeps_its_own_results(calls, tmp_path):
    bs = [built("u", "wrong"), built("v", "same"), built("v", "slow")]
    facts, results = runner.run_all(None, Libs(), bs, ["u", "v"], opts(tmp_path, jobs=2), out=lambda *a: None)
    assert set(facts) == {"u", "v"}
    assert sorted(r["outcome"] for r in results.values()) == ["killed", "killed", "survived"]


def test_the_calibration_mutant_is_the_whole_mutated_file_refused_by_any_check():
    m = runner.as_mutant(built("u", "wrong"))
    assert (m.unit, m.source, m.must_fail_check, m.origin) == ("u", "// wrong\n", "any", "mutation")
    assert m.rejected_by("nmse") and not m.rejected_by("pass") and not m.rejected_by("skipped")


def test_a_judged_mutants_library_is_removed_and_the_known_goods_kept(calls, tmp_path):
    cache = tmp_path / "cache"
    good = cache / "lib" / "k0" / "good.so"
    good.parent.mkdir(parents=True)
    good.write_text("")
    elsewhere = tmp_path / "kept" / "same.so"
    elsewhere.parent.mkdir()
    elsewhere.write_text("")

    class CachedLibs(Libs):
        def __init__(self):
            self.cache = cache

        def known_good(self):
            return good

        def mutant(self, m):
            if m.why == "same":  # not in the builder's layout: never removed
                return elsewhere
            lib = cache / "lib" / f"k-{m.why}" / f"{m.why}.so"
            lib.parent.mkdir(parents=True, exist_ok=True)
            lib.write_text("")
            return lib

    runner.run_all(None, CachedLibs(), [built("u", "wrong"), built("u", "slow"), built("u", "same")], ["u"],
                   opts(tmp_path), out=lambda *a: None)
    assert sorted(p.name for p in (cache / "lib").iterdir()) == ["k0"] and good.is_file() and elsewhere.is_file()


def test_a_mutant_refused_by_the_untimed_cases_is_killed_without_the_production_sizes(monkeypatch, tmp_path):
    """The screen: each mutant first on the spec's untimed cases.  Refused there, it is killed by that check
    and the whole spec (the production-size timed cases, most of a heavy spec's time) never runs for it;
    passing there decides nothing: the whole spec runs, so a flaw only the production sizes show is still
    killed, by the whole spec.  A spec with no timed case is run once, as before."""
    from types import SimpleNamespace

    runs = []
    full = {"good.so": True, "wrong.so": False, "bigonly.so": False, "same.so": True, "wrongtoo.so": False}
    screened = {"wrong.so": False, "bigonly.so": True, "same.so": True, "wrongtoo.so": False}

    def parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False, screen=False):
        name = Path(lib).name
        runs.append((unit, name, screen))
        ok = screened[name] if screen else full[name]
        ev = {"timing": {"median_ms": 1.0}, **({"screen": {"cases": 3}} if screen else {})}
        return GateResult("parity", ok, "parity ok" if ok else "parity failed [nmse]", evidence=ev,
                          check=None if ok else "nmse")

    monkeypatch.setattr(calibrator, "parity_on_library", parity)
    monkeypatch.setattr(calibrator, "perf_on_mutant", lambda *a: GateResult("perf", True, "perf ok"))
    shapes = {"timed": [SimpleNamespace(timed=False), SimpleNamespace(timed=True)],
              "untimed": [SimpleNamespace(timed=False), SimpleNamespace(timed=False)]}
    monkeypatch.setattr(runner, "load_spec", lambda target, unit: SimpleNamespace(shapes=shapes[unit]))
    bs = [built("timed", t) for t in ("wrong", "bigonly", "same")] + [built("untimed", "wrongtoo")]
    _, results = runner.run_all(None, Libs(), bs, ["timed", "untimed"], opts(tmp_path, screen=True),
                                out=lambda *a: None)
    got = {(r["id"][:7].rstrip("0"), u): (r["outcome"], r.get("check"), r.get("screen", False))
           for u in ("timed", "untimed") for r in results.values() if r["id"] in {b.mutation.id for b in bs
                                                                                   if b.mutation.unit == u}}
    assert got == {("wrong", "timed"): ("killed", "nmse", True), ("bigonly", "timed"): ("killed", "nmse", False),
                   ("same", "timed"): ("survived", None, False), ("wrongto", "untimed"): ("killed", "nmse", False)}
    of = lambda unit, name: [sc for u, n, sc in runs if (u, n) == (unit, name)]  # noqa: E731
    assert of("timed", "wrong.so") == [True], "refused by the screen: the whole spec never ran for it"
    assert of("timed", "bigonly.so") == [True, False] and of("timed", "same.so") == [True, False]
    assert of("untimed", "wrongtoo.so") == [False], "nothing to screen: one run"
    assert of("timed", "good.so") == [False], "the known-good always runs the whole spec"
