"""Generating and sampling mutants (porter/calibration/mutate/generate.py): ids that stay put, diffs against
the known-good, and a sample that is the same for the same seed and never over the budget."""

from __future__ import annotations

from collections import Counter

import pytest

from porter.calibration.mutate.generate import candidates, mutation_id, operators_named, sample
from porter.errors import PorterError

from test_mutate_operators import SNIPPET


def test_a_mutations_id_is_a_hash_of_unit_operator_location_and_replacement():
    ms = candidates("u", SNIPPET)
    assert len({m.id for m in ms}) == len(ms), "two mutations share an id"
    m = next(x for x in ms if x.op == "compare" and x.location == "7:11")
    assert m.id == mutation_id("u", "compare", 7, 11, ">=", ">")
    assert m.id != mutation_id("v", "compare", 7, 11, ">=", ">")  # another unit
    assert m.id != mutation_id("u", "compare", 7, 11, ">=", "<")  # another replacement
    assert [x.id for x in candidates("u", SNIPPET)] == [x.id for x in ms]  # the same on every run


def test_an_id_survives_an_edit_elsewhere_below_it_and_changes_when_its_line_moves():
    before = {m.location: m.id for m in candidates("u", SNIPPET) if m.op == "drop_sync"}
    below = SNIPPET.replace("    return 0;\n}", "    int unused = 1;\n    return 0;\n}")
    assert {m.location: m.id for m in candidates("u", below) if m.op == "drop_sync"} == before
    above = SNIPPET.replace('#include "conv.cuh"\n', '#include "conv.cuh"\n// a new comment line\n')
    moved = {m.location: m.id for m in candidates("u", above) if m.op == "drop_sync"}
    assert list(moved) == ["11:5"] and set(moved.values()).isdisjoint(before.values())


def test_the_diff_shows_the_one_edit_against_the_known_good():
    m = next(x for x in candidates("u", SNIPPET) if x.op == "drop_sync")
    d = m.diff(SNIPPET)
    assert d.startswith("--- u.cu (known-good)\n+++ u.cu (mutant ")
    assert [ln for ln in d.splitlines() if ln[:1] in "+-" and ln[:3] not in ("---", "+++")] == \
        ["-    __syncthreads();", "+    ;"]


def test_sampling_is_deterministic_per_seed_and_respects_the_budget():
    ms = candidates("u", SNIPPET)
    per_op = Counter(m.op for m in ms)
    assert max(per_op.values()) > 3, "the snippet needs operators with more edits than the budget"
    a, b = sample(ms, 3, seed=7), sample(ms, 3, seed=7)
    assert [m.id for m in a] == [m.id for m in b]
    got = Counter(m.op for m in a)
    assert got == {op: min(3, n) for op, n in per_op.items()}
    others = [[m.id for m in sample(ms, 3, seed=s)] for s in range(1, 6)]
    assert any(o != [m.id for m in a] for o in others), "the seed changes nothing"
    assert [m.id for m in a] == [m.id for m in ms if m.id in {x.id for x in a}], "the sample keeps source order"


def test_one_operators_sample_does_not_depend_on_the_others_asked_for():
    every = sample(candidates("u", SNIPPET), 2, seed=3)
    only = sample(candidates("u", SNIPPET, operators_named(["constant"])), 2, seed=3)
    assert [m.id for m in every if m.op == "constant"] == [m.id for m in only]


def test_no_budget_keeps_all_and_a_negative_one_is_refused():
    ms = candidates("u", SNIPPET)
    assert sample(ms, None, 0) == ms
    with pytest.raises(PorterError, match="at least 0"):
        sample(ms, -1, 0)


def test_an_unknown_operator_is_named_in_one_line():
    with pytest.raises(PorterError, match=r"no mutation operator swap_ops \(known: arith, "):
        operators_named(["swap_ops"])

