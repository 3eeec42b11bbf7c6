"""The speedup gate (porter.optimize.ab) with synthetic round timings in place of the GPU: old and new
are timed in ABBA order, a clear win passes with its evidence, the committed kernel against itself is
inconclusive, a slower one is "slower", and a candidate round that fails parity refuses it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from porter.gates.driver import Candidate, GateContext
from porter.gates.result import GateResult
from porter.optimize import ab
from porter.optimize.decide import ALPHA, ROUNDS
from porter.target import load_target

UNIT = "mini_gpu_add_tensor"  # an op unit with a timed case
OLD_LIB, NEW_LIB = Path("/committed/libmini.so"), Path("/candidate/libmini.so")


class SyntheticRounds:
    """time_round's stand-in: each library's true time times lognormal noise; optionally a failing round."""

    def __init__(self, old_ms: float, new_ms: float, fail_round: int | None = None, seed: str = "rounds"):
        self.ms = {OLD_LIB: old_ms, NEW_LIB: new_ms}
        self.rng = random.Random(seed)
        self.fail_round = fail_round
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, target, spec, library, ctx, candidate_sha256):
        self.calls.append(("old" if library == OLD_LIB else "new", [s.label for s in spec.shapes]))
        if self.fail_round is not None and len(self.calls) - 1 == self.fail_round:
            return GateResult("parity", False, "parity failed [values] on 'n=2^20+5 (bandwidth)'", check="values",
                              diagnostics="max abs 3.2 > 1e-6")
        t = self.ms[library] * self.rng.lognormvariate(0, 0.02)
        return GateResult("parity", True, "parity ok", evidence={"timing": {"median_ms": t, "roofline_ms": 0.004}})


@pytest.fixture
def gate(workspace, monkeypatch):
    target = load_target(workspace, "minimoe")
    committed = Candidate.of(UNIT, "// committed\n")
    monkeypatch.setattr(ab, "committed_library", lambda candidate, ctx: (committed, OLD_LIB, ""))

    def run(timer: SyntheticRounds, source: str = "// faster\n") -> GateResult:
        monkeypatch.setattr(ab, "time_round", timer)
        ctx = GateContext(target, workspace, library=NEW_LIB)
        return ab.run(Candidate.of(UNIT, source), ctx)
    return run


def test_rounds_are_interleaved_abba_on_the_timed_cases_only(gate):
    timer = SyntheticRounds(1.0, 0.5)
    gate(timer)
    sides = [side for side, _ in timer.calls]
    assert sides == ab.abba(ROUNDS) and sides[:6] == ["old", "new", "new", "old", "old", "new"]
    assert sides.count("old") == sides.count("new") == ROUNDS
    assert all(labels == ["n=2^20+5 (bandwidth)"] for _, labels in timer.calls)  # the untimed cases are not run


def test_a_clear_speedup_passes_with_its_evidence(gate):
    res = gate(SyntheticRounds(1.0, 0.5))
    assert res.ok and res.summary.startswith("speedup: 2.0") and "x faster" in res.summary, res.summary
    ev = res.evidence
    assert len(ev["medians_ms"]["old"]) == len(ev["medians_ms"]["new"]) == ROUNDS
    d = ev["decision"]
    assert d["verdict"] == "faster" and d["p_value"] < ALPHA and d["alpha"] == ALPHA
    assert d["gain"] > d["min_gain"] >= d["aa_margin"]
    assert ev["order"] == ab.abba(ROUNDS) and ev["committed_sha256"] == Candidate.of(UNIT, "// committed\n").sha256
    assert ev["roofline_fraction"]["new"] == pytest.approx(2 * ev["roofline_fraction"]["old"], rel=0.1)
    assert res.metrics["speedup"] == pytest.approx(2.0, rel=0.05)


def test_the_committed_kernel_against_itself_is_inconclusive(gate):
    for seed in range(20):
        res = gate(SyntheticRounds(1.0, 1.0, seed=f"aa-{seed}"), source="// committed\n")
        assert not res.ok and not res.skipped and res.check == "inconclusive", res.summary
        assert res.summary.startswith("speedup inconclusive: ")


def test_a_slower_candidate_is_refused_as_slower(gate):
    res = gate(SyntheticRounds(1.0, 1.5))
    assert not res.ok and res.check == "slower" and res.summary.startswith("speedup slower: ")


def test_a_candidate_round_that_fails_parity_refuses_it(gate):
    res = gate(SyntheticRounds(1.0, 0.5, fail_round=5))  # round 6 is the candidate's (A B B A A B)
    assert not res.ok and not res.skipped and res.check == "parity"
    assert "round 6 of the candidate failed parity" in res.summary and res.diagnostics == "max abs 3.2 > 1e-6"


def test_a_committed_round_that_fails_is_not_the_candidates_fault(gate):
    res = gate(SyntheticRounds(1.0, 0.5, fail_round=0))  # round 1 is the committed side's
    assert res.skipped and not res.ok and "round 1 (old)" in res.summary


def test_a_unit_without_a_timed_case_is_skipped(workspace, monkeypatch):
    target = load_target(workspace, "minimoe")
    monkeypatch.setattr(ab, "time_round", lambda *a: pytest.fail("nothing to time"))
    res = ab.run(Candidate.of("mini_gpu_synchronize", "x"), GateContext(target, workspace, library=NEW_LIB))
    assert res.skipped and "no timed parity case" in res.summary


def test_porter_run_never_asks_for_the_speedup_gate():
    from porter.gates import registry

    assert "speedup" not in registry.names(registry.ANSWER, registry.UNIT)
    assert registry.names()[registry.names().index("perf") + 1] == "speedup"
    assert registry.get("speedup").needs == ("perf",)
