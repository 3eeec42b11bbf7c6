"""Every gate porter knows, in the order a candidate meets them: the one list, and the one place a
gate's name means anything.

Each entry declares what the rest of porter needs to know about a gate, so nothing else names one:
- `judges`: what it looks at: the provider's answer, one unit, a unit against its committed self
  (only `porter optimize` asks for that), or the whole backend (e2e);
- `role`: what its pass says: the answer holds a candidate, the source is admissible, the library
  links, the output is right, the speed is acceptable;
- `needs`: the gates that must have passed before it (their verdict is what it judges further);
  `uses` / `produces`: what it reads from / leaves in the GateContext for the gates after it
  (build leaves the library), and `ahead`: it prepares its inputs while the gate producing what it
  uses runs (its module's `start_ahead`).  The candidate is not left in the context: a gate judging
  the answer returns it, typed (porter.gates.driver.extract_candidate), before any unit gate runs;
- `verifies`: its pass is part of what makes a unit's step 'verified' (`proof_of`);
- `rechecked`, `runs_candidate`, `mutant_check`: what `status --reverify`, a refusal after a
  'built' step and calibration's scripted mutants make of it.

The driver orders and runs gates from these declarations; `porter run`, `porter optimize`,
`status` (and --reverify), the report, the scripted provider and calibration ask this module
which gates exist, which count and what a refusal means.  So a new gate is one module with
`run(candidate, ctx) -> GateResult` (a gate judging the answer: `run(answer, ctx) -> (GateResult,
Candidate or None)`) plus one entry below (tests/test_gate_registry.py shows one,
tests/test_architecture.py keeps gate names out of every other module).  Modules are named, not
imported: this is a leaf every module may read, and a gate loads when it first runs.  Names are
never renamed: ledger and evidence records name gates, and old records must keep reading.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# what a gate judges
ANSWER, UNIT, BACKEND = "answer", "unit", "backend"  # the provider's text, one unit, the whole backend (e2e)
SPEEDUP = "speedup"  # a unit against its committed self: only `porter optimize` asks for it

# what its pass says (its role)
CANDIDATE = "candidate"  # the answer holds one candidate: every later gate judges that, not the answer
SOURCE = "source"  # the candidate's source is admissible; nothing is compiled or run
LIBRARY = "library"  # the candidate compiles and links into a library later gates load
OUTPUT = "output"  # what the candidate (or the backend holding it) computes is right
SPEED = "speed"  # how fast it computes it is acceptable

# the states of a step record, and the proof each stands on (proof_of)
BUILT, VERIFIED = "built", "verified"

# what a gate leaves in the GateContext for later ones (uses / produces)
LIBRARY_FILE = "library"  # ctx.library, and ctx.whole_backend (the backend with this candidate)


@dataclass(frozen=True)
class Gate:
    name: str
    module: object  # a module path, or an object with run() (a test's stand-in)
    judges: str = UNIT
    role: str = SOURCE
    needs: tuple[str, ...] = ()  # gates that must have passed first: their verdict is what this one judges
    uses: tuple[str, ...] = ()  # what it reads that an earlier gate produces (beside the candidate itself)
    produces: tuple[str, ...] = ()
    ahead: bool = False  # its module's start_ahead(candidate, ctx) begins its inputs while `uses` is produced
    verifies: bool = False  # its pass is part of 'verified'
    rechecked: bool = True  # `status --reverify` runs it on the unit files as they are
    runs_candidate: bool = False  # scripted bad answers reaching it are mutants; its refusal refutes a 'built' step
    mutant_check: str | None = None  # the check a scripted answer expected to be refused here must fail ('any')

    def load(self):
        return importlib.import_module(self.module) if isinstance(self.module, str) else self.module


# Cheapest first: an answer that does not compile never costs a GPU run; perf times only what
# parity passed, and is not re-checked by --reverify (its limit is relative to a run's baseline).
ACTIVE: tuple[Gate, ...] = (
    Gate("extract", "porter.gates.extract", judges=ANSWER, role=CANDIDATE, rechecked=False),
    Gate("static", "porter.gates.static", role=SOURCE),
    Gate("build", "porter.gates.build", role=LIBRARY, produces=(LIBRARY_FILE,)),
    Gate("parity", "porter.gates.parity", role=OUTPUT, uses=(LIBRARY_FILE,), ahead=True, verifies=True,
         runs_candidate=True, mutant_check="any"),
    Gate("perf", "porter.gates.perf", role=SPEED, needs=("parity",), uses=(LIBRARY_FILE,), rechecked=False,
         runs_candidate=True, mutant_check="slowdown"),
    Gate("speedup", "porter.optimize.ab", judges=SPEEDUP, role=SPEED, needs=("perf",), uses=(LIBRARY_FILE,),
         rechecked=False, runs_candidate=True),
    Gate("e2e", "porter.gates.e2e.gate", judges=BACKEND, role=OUTPUT, uses=(LIBRARY_FILE,), rechecked=False),
    # the engine's tokens/s against upstream's: only on a backend e2e found right
    Gate("throughput", "porter.gates.e2e.throughput_gate", judges=BACKEND, role=SPEED, needs=("e2e",),
         uses=(LIBRARY_FILE,), rechecked=False),
)


def names(*judges: str, **flags) -> tuple[str, ...]:
    """Gate names in order: those judging `judges` (all when none) whose fields equal `flags`
    (e.g. names(UNIT, role=SPEED), names(verifies=True))."""
    return tuple(g.name for g in ACTIVE if (not judges or g.judges in judges)
                 and all(getattr(g, k) == v for k, v in flags.items()))


def get(name: str) -> Gate:
    gate = next((g for g in ACTIVE if g.name == name), None)
    if gate is None:
        raise ValueError(f"unknown gate {name!r}")
    return gate


def known(name) -> Gate | None:
    """The gate of that name, or None: records name gates, and an old or hand-made record may name
    one this porter does not have (readers treat it as no gate of any role)."""
    return next((g for g in ACTIVE if g.name == name), None)


def ordered(gates) -> tuple[str, ...]:
    """`gates` (names) in the order a candidate meets them (an unknown name: ValueError)."""
    order = names()
    return tuple(sorted((get(g).name for g in gates), key=order.index))


def proof_of(state: str) -> tuple[str, ...]:
    """The gates whose passing evidence a step of `state` stands on: a 'verified' step on every gate
    that counts toward verified, a 'built' one on the gates that make the library; () for any other
    state (a step record of an unknown state proves nothing)."""
    if state == VERIFIED:
        return names(verifies=True)
    if state == BUILT:
        return names(role=LIBRARY)
    return ()


def step_state(passed) -> str:
    """The state a step lands in once its gates passed: 'verified' where every gate that counts
    toward it passed (`passed(name)`), else 'built'."""
    proof = proof_of(VERIFIED)
    return VERIFIED if proof and all(passed(g) for g in proof) else BUILT


def with_producers(gates) -> tuple[str, ...]:
    """`gates` and the gates that produce what they use, in order (a committed file's parity needs
    the library built again; the candidate itself is the file, so the answer's gate is not asked)."""
    want = set(gates)
    for g in reversed(ACTIVE):
        if g.name in want:
            want |= {p.name for p in ACTIVE if p.judges != ANSWER and set(p.produces) & set(g.uses)}
    return ordered(want)


def mutant_check(name) -> str | None:
    """The check a scripted answer whose manifest expects gate `name` to refuse it must fail in
    calibration ('any': any check of that gate), or None where the gate makes no mutants of it."""
    g = known(name)
    return g.mutant_check if g is not None and g.runs_candidate else None


def problems(gates: tuple[Gate, ...] | None = None) -> list[str]:
    """What is inconsistent in a registry: a name twice, a gate needing a gate that does not come
    before it, or using what no earlier gate produces."""
    gates = ACTIVE if gates is None else gates
    out, before, made = [], set(), set()
    for g in gates:
        if g.name in before:
            out.append(f"{g.name}: registered twice")
        out += [f"{g.name} needs {n}, which does not come before it" for n in g.needs if n not in before]
        out += [f"{g.name} uses {u}, which no gate before it produces" for u in g.uses if u not in made]
        if g.ahead and not g.uses:
            out.append(f"{g.name} prepares ahead, but of nothing it uses")
        before.add(g.name)
        made |= set(g.produces)
    return out
