"""A run that makes no timed calls (a shared GPU's, a seed sweep's fresh sets, a mutant's) builds no input
sets for timed calls alone; a timed run always gets them, whatever was prepared before it."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.gates.parity import gate
from porter.spec import Context, load_spec
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_add_tensor"  # one timed case (2^20+5 elements) among untimed ones


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@pytest.fixture
def spec(target):
    s = load_spec(target, UNIT)
    assert any(sh.timed for sh in s.shapes)
    return s


def timed_case(cases):
    return next(c for c in cases if c.shape.timed)


def test_the_timing_only_sets_are_built_for_a_timed_run_only(target, spec):
    fn, ctx = target.api_function(UNIT), Context.for_target(target)
    timed = gate.prepare(spec, fn, ctx, [1, 2])
    untimed = gate.prepare(spec, fn, ctx, [1, 2], timing_sets=False)
    assert len(timed_case(timed).timing_calls) == gate.timing_set_count() - 2 >= 1
    assert timed_case(untimed).timing_calls == []
    # everything else is the same calls
    assert [len(c.calls) for c in timed] == [len(c.calls) for c in untimed]


def test_remembered_cases_with_timing_sets_serve_an_untimed_run_never_the_reverse(target, spec, monkeypatch):
    built = []
    real = gate.prepare
    monkeypatch.setattr(gate, "prepare", lambda *a, **kw: built.append(kw.get("timing_sets", True)) or real(*a, **kw))
    monkeypatch.setattr(gate, "_PREPARED", {})
    fn, ctx = target.api_function(UNIT), Context.for_target(target)
    untimed, _ = gate._prepared(spec, fn, ctx, [5, 6], remember=True, timing_sets=False)
    assert built == [False]
    timed, _ = gate._prepared(spec, fn, ctx, [5, 6], remember=True, timing_sets=True)
    assert built == [False, True] and timed_case(timed).timing_calls  # untimed cases could not serve it
    # seeds remembered with their timing sets only: an untimed run takes those, building nothing
    monkeypatch.setattr(gate, "_PREPARED", {})
    timed, _ = gate._prepared(spec, fn, ctx, [7, 8], remember=True, timing_sets=True)
    again, _ = gate._prepared(spec, fn, ctx, [7, 8], remember=True, timing_sets=False)
    assert built == [False, True, True] and again is timed


def test_a_timed_run_replaces_cases_prepared_without_timing_sets(target, spec, monkeypatch):
    made = []
    real = gate.prepare_cases
    monkeypatch.setattr(gate, "prepare_cases",
                        lambda *a, **kw: made.append(kw.get("timing_sets", True)) or real(*a, **kw))
    ahead = real(target, spec, timing_sets=False)
    kind = gate.OpKind()
    assert kind.prepare(target, spec, None, None, ahead, Path("unused"), timed=False) is ahead and made == []
    got = kind.prepare(target, spec, None, None, ahead, Path("unused"), timed=True)
    assert made == [True] and got is not ahead and timed_case(got.cases).timing_calls


def test_run_spec_asks_for_timing_sets_exactly_when_it_times(target, spec, monkeypatch, tmp_path):
    asked = []

    def stop(self, target, spec, seeds, ctx, prepared, files, timed=True):
        asked.append(timed)
        return gate.Prepared(spec.unit, spec.sha256, [1, 2], [], None, "stopped here by the test")

    monkeypatch.setattr(gate.OpKind, "prepare", stop)
    for reps in (0, 10):
        gate.run_spec(target, spec, tmp_path / "lib.so", workspace=tmp_path, mode="host", timing_reps=reps)
    assert asked == [False, True]
