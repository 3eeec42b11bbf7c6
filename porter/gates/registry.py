"""Every gate porter knows, in the order a candidate meets them: the one list.

The driver, `porter run`, `status --reverify`, the report, the scripted
provider and the mutant lists all derive theirs from `gates()`, so a new gate is
one module with `run(candidate, ctx) -> GateResult` plus one entry in GATES.
Modules are named, not imported, here: this is the leaf every other module may
read (a gate module importing the registry makes no cycle), and a gate's
dependencies load only when it first runs.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, replace

# what a gate judges
ANSWER = "answer"  # the provider's text; hands the unit it found to the gates after it (ctx.candidate)
UNIT = "unit"  # one unit's candidate source
BACKEND = "backend"  # the whole backend the build linked (e2e), asked for by the run once units are verified


@dataclass(frozen=True)
class Gate:
    name: str
    module: object  # a module path (imported at first use), or a module-like object with run()
    judges: str = UNIT
    needs: tuple[str, ...] = ()  # gates that must have passed first: their verdict is what this one judges
    rechecked: bool = True  # `status --reverify` runs it on the unit files as they are
    runs_candidate: bool = False  # executes the candidate: scripted bad answers that reach it are mutants,
    # and its refusal of a committed 'built' file refutes that step

    def load(self):
        return importlib.import_module(self.module) if isinstance(self.module, str) else self.module


# Cheapest first: an answer that does not compile never costs a GPU run, and perf
# times only what parity measured and passed (timing a wrong kernel says nothing).
# Perf is not re-checked by `status --reverify`: its limits are relative to a
# calibrated baseline taken by a run, not a fact of the file alone.
GATES: tuple[Gate, ...] = (
    Gate("extract", "porter.gates.extract", judges=ANSWER, rechecked=False),
    Gate("static", "porter.gates.static"),
    Gate("build", "porter.gates.build"),
    Gate("parity", "porter.gates.parity", runs_candidate=True),
    Gate("perf", "porter.gates.perf", needs=("parity",), rechecked=False, runs_candidate=True),
    Gate("e2e", "porter.gates.e2e.gate", judges=BACKEND, rechecked=False),
)
ACTIVE: tuple[Gate, ...] = GATES


def gates() -> tuple[Gate, ...]:
    return ACTIVE


def names(judges: tuple[str, ...] = (ANSWER, UNIT, BACKEND)) -> tuple[str, ...]:
    return tuple(g.name for g in ACTIVE if g.judges in judges)


def get(name: str) -> Gate:
    gate = next((g for g in ACTIVE if g.name == name), None)
    if gate is None:
        raise ValueError(f"unknown gate {name!r}")
    return gate


def unit_gates(start: str | None = None) -> tuple[str, ...]:
    """The gates of one candidate unit, from `start` on (a committed file already passed those before)."""
    chain = names((UNIT,))
    return chain[chain.index(start):] if start else chain


def answer_gates() -> tuple[str, ...]:
    """What an answer meets in `porter run`: extraction, then the unit gates."""
    return names((ANSWER, UNIT))


def rechecked() -> tuple[str, ...]:
    return tuple(g.name for g in ACTIVE if g.judges == UNIT and g.rechecked)


def runs_candidate() -> tuple[str, ...]:
    return tuple(g.name for g in ACTIVE if g.runs_candidate)


def with_modules(**modules) -> tuple[Gate, ...]:
    """The active gates with some modules replaced (tests: stand-ins for the GPU gates)."""
    return tuple(replace(g, module=modules.get(g.name, g.module)) for g in ACTIVE)


@contextmanager
def using(gates: tuple[Gate, ...]):
    """Run the block with `gates` as the registry (tests: a gate only the test knows)."""
    global ACTIVE
    before, ACTIVE = ACTIVE, tuple(gates)
    try:
        yield ACTIVE
    finally:
        ACTIVE = before
