"""The one gate driver: the provider's answer becomes a typed Candidate first, then the Candidate meets
the unit gates in the registry's order, and the first refusal ends it.

    answer = Answer(unit, text, Provenance(provider, model, prompt_sha256, response_sha256, attempt))
    made = extract_candidate(answer, ctx)          # the answer gates: the candidate, or their refusal
    results = run_gates(made.candidate, ctx, on_result=record)

A candidate that is not an answer (a committed unit file, a prebuilt library, the whole backend) goes
straight to run_gates.  Every unit gate module exposes `run(candidate, ctx) -> GateResult`; a gate
judging the answer exposes `run(answer, ctx) -> (GateResult, the Candidate it holds or None)`.  The
list, the order and what each gate needs and makes live in porter.gates.registry only (porter run,
status --reverify, calibration and the benchmark all call run_gates), and the driver knows no gate by
name: it runs the chain in the registry's order, stops a gate whose `needs` did not pass, and starts
the inputs of a gate declared `ahead` while the gate producing what it uses runs.
A backend gate's candidate is the whole backend (E2E_UNIT) and its library the
one the library gate linked.  A gate that could not run here (no GPU, no spec)
is `skipped`: it does not stop the chain, and it never counts as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable

from porter.gates import build, registry
from porter.gates.candidate import Answer, Candidate, Provenance  # noqa: F401 (where callers find them)
from porter.gates.result import GateResult
from porter.records.history import History


@dataclass
class Extraction:
    """What the answer gates made of an answer: the candidate it holds (None: they refused it) and
    their results, the refusal last."""

    answer: Answer
    candidate: Candidate | None
    results: list[GateResult]


@dataclass
class ParityOptions:
    mode: str = "cuda"  # "host": the C stand-in of CI (calibration tests)
    sanitize: bool | None = None  # None: $PORTER_PARITY_SANITIZE
    timeout: float | None = None  # None: $PORTER_PARITY_TIMEOUT or the gate's default
    timing_reps: int = 10
    seeds: list[int] | None = None  # None: fresh os.urandom seeds (never the prompt's)
    # environment the library under test runs with (a known-good variant's knobs that choose other
    # kernels); set in the parity child before the library loads, recorded in the evidence
    env: dict[str, str] | None = None
    regime: str | None = None  # None: the target's [perf] regime; another name: a comparison run (perf-table)
    fresh_process: bool = False  # a fresh child, never a warm worker (the perf gate's re-time)
    # only the cases the spec does not time: a mutation screen (a kill there is the spec's kill; a pass decides
    # nothing, the whole spec runs next), never a candidate's verdict
    screen: bool = False


@dataclass
class GateContext:
    """What the gates share for one candidate: the target, where to build, and what earlier gates made."""

    target: object
    workspace: Path | None = None
    build_cache: Path | None = None
    parity: ParityOptions = field(default_factory=ParityOptions)
    library: Path | None = None  # the unit's library the build gate linked (or a prebuilt one)
    # () -> the whole backend with this candidate (every unit's current file), linked when a gate asks
    whole_backend: Callable[[], Path] | None = None
    results: dict[str, GateResult] = field(default_factory=dict)  # gate -> result, for the gates after it
    # gate -> a Future of the inputs its start_ahead began while the gate making what it uses ran
    # (parity's inputs and references, made during the build)
    ahead: dict[str, object] = field(default_factory=dict)
    candidate: Candidate | None = None  # what the gates judge (run_gates sets it; never the answer)
    # progress of a long job inside a gate (the first build of every placeholder object): a
    # factory (what, total) -> porter.term.Steps given by the command that owns the terminal; None: silent
    progress: Callable | None = None
    log: Callable | None = None  # a line for the run's log (a backend gate's minutes of runs, one by one)

    def __post_init__(self):
        self.workspace = Path(self.workspace or self.target.workspace)
        if self.build_cache is None:
            self.build_cache = build.cache_dir(self.workspace)

    def units_checks_call(self, unit: str) -> set[str]:
        """The other units the gates that run the candidate call to judge `unit` (parity's runtime
        scenarios call the units they need; a gate says so with `units_it_calls`): the unit's library
        links their files, not placeholders."""
        out: set[str] = set()
        for name in registry.names(registry.UNIT, runs_candidate=True):
            calls = getattr(registry.get(name).load(), "units_it_calls", None)
            if calls is not None:
                out |= set(calls(self.target, unit))
        return out

    @cached_property
    def history(self) -> History:
        """The workspace's ledger, read when a gate first needs calibration facts."""
        return History.read(self.workspace, self.target.name)


def answer_gates(gates=None) -> tuple[str, ...]:
    """Of `gates` (default: the registry's), those judging the answer, in order: they run first, on the
    answer, and make the candidate the others judge."""
    chosen = registry.names() if gates is None else gates
    return registry.ordered(g for g in chosen if registry.get(g).judges == registry.ANSWER)


def candidate_gates(gates) -> tuple[str, ...]:
    """Of `gates`, those judging a candidate (everything after the answer gates), in order."""
    return registry.ordered(g for g in gates if registry.get(g).judges != registry.ANSWER)


def extract_candidate(answer: Answer, ctx: GateContext, gates=None,
                      on_result: Callable[[GateResult], None] | None = None) -> Extraction:
    """The answer gates (`gates`, default: every gate judging the answer) on `answer`, in order, until
    one refuses: the typed Candidate the answer holds, carrying its provenance, or None and the refusal.
    Nothing judges the candidate here: that is run_gates, after the caller recorded the attempt."""
    out: list[GateResult] = []
    candidate: Candidate | None = None
    for gate in (registry.get(g) for g in answer_gates(gates)):
        res, made = gate.load().run(answer, ctx)
        res.evidence.setdefault("candidate_sha256", made.sha256 if made is not None else None)
        ctx.results[gate.name] = res
        out.append(res)
        if on_result is not None:
            on_result(res)
        if not res.ok:
            return Extraction(answer, None, out)
        candidate = made if made is not None else candidate
    if candidate is None:  # no answer gate made one: the answer's text is the unit's code as it stands
        candidate = Candidate.of(answer.unit, answer.text)
    return Extraction(answer, replace(candidate, provenance=answer.provenance), out)


def run_gates(candidate: Candidate, ctx: GateContext, gates=None,
              on_result: Callable[[GateResult], None] | None = None) -> list[GateResult]:
    """Run `gates` (default: the unit gates) on `candidate` in the registry's order until one refuses;
    returns every result, the refusal last.  A gate judging the answer is not one of them: an answer
    becomes a candidate through extract_candidate first."""
    asked = registry.names(registry.UNIT) if gates is None else gates
    if answer_gates(asked):
        raise ValueError(f"{', '.join(answer_gates(asked))} judge(s) the answer: extract_candidate runs them, "
                         "run_gates judges the candidate")
    chain = [registry.get(g) for g in registry.ordered(asked)]
    ctx.candidate = candidate
    out: list[GateResult] = []
    for i, gate in enumerate(chain):
        if not all(passed(ctx.results.get(n)) for n in gate.needs):
            break  # e.g. perf with nothing measured to time
        _start_ahead(gate, chain[i + 1:], ctx)
        res = gate.load().run(candidate, ctx)
        res.evidence.setdefault("candidate_sha256", candidate.sha256)
        ctx.results[gate.name] = res
        out.append(res)
        if on_result is not None:
            on_result(res)
        if not res.ok and not res.skipped:
            break
    for name, fut in ctx.ahead.items():
        if fut is not None and name not in ctx.results:
            fut.cancel()  # the chain stopped before it: not started yet, it never will be
    return out


def _start_ahead(producer, later, ctx: GateContext) -> None:
    """Before `producer` runs: the later gates of the chain declared `ahead` that use what it produces
    begin their inputs now (parity's inputs and references need no library: made while nvcc compiles)."""
    for gate in later:
        if gate.ahead and gate.name not in ctx.ahead and set(gate.uses) & set(producer.produces):
            start = getattr(gate.load(), "start_ahead", None)
            ctx.ahead[gate.name] = start(ctx.candidate, ctx) if start is not None else None


def passed(res: GateResult | None) -> bool:
    return res is not None and res.ok and not res.skipped


def refusal(results: list[GateResult]) -> GateResult | None:
    return next((r for r in results if not r.ok and not r.skipped), None)


def verdict_word(res: GateResult) -> str:
    return f"{res.gate} " + ("skipped" if res.skipped else "ok" if res.ok else "REFUSED")
