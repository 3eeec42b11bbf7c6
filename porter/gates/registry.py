"""Every gate porter knows, in the order a candidate meets them: the one list.

The driver, `porter run`, `status --reverify`, the report, the scripted provider and
the mutant lists derive theirs from it, so a new gate is one module with
`run(candidate, ctx) -> GateResult` plus one entry below.  Modules are named, not
imported: this is a leaf every module may read, and a gate loads when it first runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

ANSWER, UNIT, BACKEND = "answer", "unit", "backend"  # what a gate judges: the provider's text, one unit, e2e
SPEEDUP = "speedup"  # a unit against its committed self: only `porter optimize` asks for it


@dataclass(frozen=True)
class Gate:
    name: str
    module: object  # a module path, or an object with run() (a test's stand-in)
    judges: str = UNIT
    needs: tuple[str, ...] = ()  # gates that must have passed first: their verdict is what this one judges
    rechecked: bool = True  # `status --reverify` runs it on the unit files as they are
    runs_candidate: bool = False  # scripted bad answers reaching it are mutants; its refusal refutes a 'built' step

    def load(self):
        return importlib.import_module(self.module) if isinstance(self.module, str) else self.module


# Cheapest first: an answer that does not compile never costs a GPU run; perf times only what
# parity passed, and is not re-checked by --reverify (its limit is relative to a run's baseline).
ACTIVE: tuple[Gate, ...] = (
    Gate("extract", "porter.extract", judges=ANSWER, rechecked=False),
    Gate("static", "porter.gates.static"),
    Gate("build", "porter.gates.build"),
    Gate("parity", "porter.gates.parity", runs_candidate=True),
    Gate("perf", "porter.gates.perf", needs=("parity",), rechecked=False, runs_candidate=True),
    Gate("speedup", "porter.optimize.ab", judges=SPEEDUP, needs=("perf",), rechecked=False, runs_candidate=True),
    Gate("e2e", "porter.gates.e2e.gate", judges=BACKEND, rechecked=False),
)


def names(*judges: str, **flags) -> tuple[str, ...]:
    """Gate names in order: those judging `judges` (all when none) whose fields equal `flags`."""
    return tuple(g.name for g in ACTIVE if (not judges or g.judges in judges)
                 and all(getattr(g, k) == v for k, v in flags.items()))


def get(name: str) -> Gate:
    gate = next((g for g in ACTIVE if g.name == name), None)
    if gate is None:
        raise ValueError(f"unknown gate {name!r}")
    return gate
