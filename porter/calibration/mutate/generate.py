"""Operator-level mutants of one unit's known-good source, and a deterministic sample of them.

`candidates(unit, source)` lists every edit every operator proposes inside the unit's function
bodies, each as a Mutation: its operator, where it is (line:col of the known-good source), the
mutated source and a unified diff against the known-good.  Its id is a stable hash of the unit,
operator, location, the replaced text and its replacement, so a target can name a reviewed survivor
(equivalent_mutants.toml) and find it again in the next run while that code is unchanged.

`sample(mutations, budget, seed)` keeps at most `budget` of each operator's, drawn by a generator
seeded with (seed, unit, operator): the same seed gives the same mutants, whatever else is asked.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from dataclasses import dataclass

from porter.calibration.mutate.operators import BY_NAME, OPERATORS, Edit, Operator, edits_in
from porter.calibration.mutate.scope import parse_bodies
from porter.errors import PorterError

ID_LENGTH = 12


@dataclass(frozen=True)
class Mutation:
    unit: str
    op: str
    line: int
    col: int
    function: str  # the function whose body holds the edit
    where: str  # kernel / device / host
    original: str  # the replaced text ("" for an insertion)
    replacement: str
    note: str
    id: str
    source: str  # the whole mutated unit source

    @property
    def location(self) -> str:
        return f"{self.line}:{self.col}"

    @property
    def name(self) -> str:
        """The calibration mutant name of this mutation: `mutate:<op>:<id>`."""
        return f"mutate:{self.op}:{self.id}"

    def diff(self, known_good: str, context: int = 2) -> str:
        return "".join(difflib.unified_diff(known_good.splitlines(keepends=True), self.source.splitlines(keepends=True),
                                            f"{self.unit}.cu (known-good)", f"{self.unit}.cu (mutant {self.id})",
                                            n=context))


def mutation_id(unit: str, op: str, line: int, col: int, original: str, replacement: str) -> str:
    what = "\0".join([unit, op, f"{line}:{col}", original, replacement])
    return hashlib.sha256(what.encode()).hexdigest()[:ID_LENGTH]


def _apply(data: bytes, e: Edit) -> str:
    return (data[:e.start] + e.replacement.encode() + data[e.end:]).decode("utf-8", "replace")


def operators_named(names: list[str] | None) -> tuple[Operator, ...]:
    if not names:
        return OPERATORS
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise PorterError(f"no mutation operator {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    return tuple(o for o in OPERATORS if o.name in names)


def candidates(unit: str, source: str, ops: tuple[Operator, ...] = OPERATORS) -> list[Mutation]:
    """Every mutation of `source` the operators propose, in operator then source order; one per distinct
    mutated source (two edits that spell the same code are one mutation)."""
    data, _tree, bodies = parse_bodies(source)
    found: list[Mutation] = []
    seen: set[str] = set()
    for body in bodies:
        for op, e in edits_in(body, data, ops):
            mutated = _apply(data, e)
            if mutated == source or mutated in seen:
                continue
            seen.add(mutated)
            original = data[e.start:e.end].decode("utf-8", "replace")
            line, col = e.at
            found.append(Mutation(unit, op.name, line, col, body.function, body.where, original, e.replacement,
                                  e.note, mutation_id(unit, op.name, line, col, original, e.replacement), mutated))
    order = {o.name: i for i, o in enumerate(OPERATORS)}
    return sorted(found, key=lambda m: (order[m.op], m.line, m.col, m.replacement))


def sample(mutations: list[Mutation], budget: int | None, seed: int) -> list[Mutation]:
    """At most `budget` mutations of each (unit, operator), chosen by a generator seeded with
    (seed, unit, operator), kept in their original order; None: all of them."""
    if budget is not None and budget < 0:
        raise PorterError(f"--budget must be at least 0, not {budget}")
    groups: dict[tuple[str, str], list[Mutation]] = {}
    for m in mutations:
        groups.setdefault((m.unit, m.op), []).append(m)
    keep: set[str] = set()
    for (unit, op), ms in groups.items():
        if budget is None or len(ms) <= budget:
            keep.update(m.id for m in ms)
            continue
        rng = random.Random(f"{seed}:{unit}:{op}")
        keep.update(m.id for m in rng.sample(ms, budget))
    return [m for m in mutations if m.id in keep]
