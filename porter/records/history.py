"""The ledger read once: one typed record per kind, and one UnitHistory per unit.

Every module that needs the past (run, status, prompt, the scripted provider,
perf, calibration) reads it here, so a rule such as "what counts as exhausted"
or "which failures the next prompt shows" is written once and every command
agrees on it.  Records are ordered by their line in the ledger file (equal to
`seq` in an intact ledger; status reports a ledger where they differ).

Rules kept here, with why:
- an attempt is *abandoned* when a "reconcile" record says so (a crash left it
  without a verdict); abandoned attempts are not answers the scripted provider
  has used, and the attempt number still moves on past them;
- a step is *live* unless a reconcile record abandoned it (its file changed
  before its commit was made);
- failures "since the last step" are those after the last live step: they are
  what the next prompt shows and what `porter prompt` shows;
- a unit is *exhausted* when an "exhausted" record comes after its last attempt
  and its last live step: a retry (`run --unit X`) after exhaustion makes it
  failing again until that retry is itself exhausted, whether or not the retry
  finished (a time budget may stop it);
- a built step is *refuted* when parity or perf later failed that same attempt's
  candidate (a GPU run re-checking a file committed where parity could not run).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

from porter.gates import registry
from porter.records.ledger import Ledger, Scan


@dataclass(frozen=True)
class Record:
    line: int
    raw: dict = field(repr=False, compare=False)
    seq: int | None = None
    kind: str = ""
    time: str = ""
    hash: str | None = None
    target: str | None = None
    unit: str | None = None
    attempt: int | None = None
    run: str | None = None


@dataclass(frozen=True)
class Attempt(Record):
    provider: str | None = None
    model: str | None = None
    candidate_sha256: str | None = None
    response_sha256: str | None = None


@dataclass(frozen=True)
class GateRecord(Record):
    gate: str | None = None
    ok: bool = False
    skipped: bool = False
    summary: str = ""
    evidence: str | None = None


@dataclass(frozen=True)
class Failure(Record):
    gate: str | None = None
    summary: str = ""
    diagnostics: str | None = None


@dataclass(frozen=True)
class Step(Record):
    state: str | None = None
    candidate_sha256: str | None = None
    unit_file: str | None = None
    evidence: tuple = ()


@dataclass(frozen=True)
class Exhausted(Record):
    attempts: int | None = None


@dataclass(frozen=True)
class Reconcile(Record):
    action: str = ""
    step: str | None = None  # the step an "abandon-step" gives up
    committed_step: str | None = None


@dataclass(frozen=True)
class Usage(Record):
    provider: str | None = None
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class Calibration(Record):
    ok: bool = False
    spec_sha256: str | None = None
    known_good: str | None = None
    known_good_sha256: str | None = None
    known_good_ok: bool | None = None
    mutants: int = 0
    mutants_rejected: int = 0
    # {name: digest} of the mutants it ran, and their scope ("all", or "rules" for a whole-library
    # known-good): a record without them predates the field
    mutant_digests: dict | None = None
    mutant_scope: str | None = None
    summary: str = ""
    evidence: str | None = None


KINDS: dict[str, type[Record]] = {
    "attempt": Attempt, "gate": GateRecord, "failure": Failure, "step": Step, "exhausted": Exhausted,
    "reconcile": Reconcile, "usage": Usage, "calibration": Calibration,
}
_FIELDS = {cls: frozenset(f.name for f in fields(cls)) - {"line", "raw"} for cls in (Record, *KINDS.values())}


def typed(line: int, raw: dict) -> Record:
    """The record of `raw`'s kind; fields of the wrong type in a tampered line are kept as found
    (status judges them), never trusted to be well-formed."""
    cls = KINDS.get(raw.get("kind"), Record)
    kw = {k: v for k, v in raw.items() if k in _FIELDS[cls]}
    if cls is Step:
        ev = raw.get("evidence")
        kw["evidence"] = tuple(ev) if isinstance(ev, list) else ()
    return cls(line=line, raw=raw, **kw)


def _last_line(records) -> int:
    return records[-1].line if records else 0


class UnitHistory:
    """One unit's records, and the facts run, status and prompt decide by."""

    def __init__(self, unit: str, records: list[Record], abandoned_attempts: set, abandoned_steps: set):
        self.unit = unit
        self.records = records
        self.attempts = [r for r in records if isinstance(r, Attempt)]
        self.live_attempts = [a for a in self.attempts if a.attempt not in abandoned_attempts]
        self.all_steps = [r for r in records if isinstance(r, Step)]
        self.steps = [s for s in self.all_steps if s.hash not in abandoned_steps]
        self.failures = [r for r in records if isinstance(r, Failure)]
        self.gates = [r for r in records if isinstance(r, GateRecord)]
        self._exhausted = [r for r in records if isinstance(r, Exhausted)]

    @property
    def last_step(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    @property
    def next_attempt(self) -> int:
        return 1 + max((a.attempt for a in self.attempts if isinstance(a.attempt, int)), default=0)

    @property
    def failures_since_step(self) -> list[Failure]:
        after = _last_line(self.steps)
        return [f for f in self.failures if f.line > after]

    @property
    def exhausted(self) -> bool:
        last = _last_line(self._exhausted)
        return last > 0 and last > _last_line(self.attempts) and last > _last_line(self.steps)

    @property
    def refutation(self) -> Failure | None:
        """The parity/perf failure of the last live step's own attempt, recorded after it."""
        step = self.last_step
        if step is None:
            return None
        return next((f for f in reversed(self.failures) if f.line > step.line and f.attempt == step.attempt
                     and f.gate in registry.names(runs_candidate=True)), None)

    def step_for(self, candidate_sha256: str | None) -> Step | None:
        """The newest live step whose candidate is this file content."""
        return next((s for s in reversed(self.steps) if candidate_sha256 and s.candidate_sha256 == candidate_sha256),
                    None)

    def answers_used(self, provider: str) -> int:
        """How many of `provider`'s answers live attempts consumed (the scripted replay position)."""
        return sum(1 for a in self.live_attempts if a.provider == provider)

    def gates_of(self, attempt: int | None) -> list[GateRecord]:
        return [g for g in self.gates if g.attempt == attempt]


class History:
    """The whole ledger of one target, typed, indexed once."""

    def __init__(self, entries: list[tuple[int, dict]], target: str, workspace: Path | None = None):
        self.target = target
        self.workspace = workspace  # where the evidence its records name is kept
        self.records = [typed(ln, raw) for ln, raw in entries]
        self.by_line = {r.line: r for r in self.records}
        mine = [r for r in self.records if (r.target if isinstance(r.target, str) else target) == target]
        self.mine = mine
        reconciles = [r for r in mine if isinstance(r, Reconcile)]
        self.abandoned_steps = {r.step for r in reconciles if isinstance(r.step, str)}  # a reconcile naming a step gives it up
        self._abandoned = {(r.unit, r.attempt) for r in reconciles
                           if str(r.action).startswith("abandon") and r.attempt is not None}
        self._per_unit: dict[str, list[Record]] = {}
        for r in mine:
            if isinstance(r.unit, str):
                self._per_unit.setdefault(r.unit, []).append(r)
        self._units: dict[str, UnitHistory] = {}

    @classmethod
    def from_scan(cls, scan: Scan, target: str, workspace: Path | None = None) -> "History":
        return cls(scan.entries, target, workspace)

    @classmethod
    def read(cls, workspace: Path, target: str, key: bytes | None = None) -> "History":
        return cls.from_scan(Ledger(Path(workspace), key).scan(), target, Path(workspace))

    def unit(self, name: str) -> UnitHistory:
        if name not in self._units:
            attempts = {a for (u, a) in self._abandoned if u == name}
            self._units[name] = UnitHistory(name, self._per_unit.get(name, []), attempts, self.abandoned_steps)
        return self._units[name]

    @cached_property
    def steps(self) -> dict[str, Step]:
        """Every step record of the target by its record hash (abandoned ones included)."""
        return {r.hash: r for r in self.mine if isinstance(r, Step) and isinstance(r.hash, str)}

    def open_attempts(self) -> list[Attempt]:
        """Attempts with neither a verdict (failure or step) nor an abandon record: what a crash leaves."""
        concluded = {(r.unit, r.attempt) for r in self.mine if isinstance(r, (Failure, Step))}
        return [a for a in self.mine if isinstance(a, Attempt)
                and (a.unit, a.attempt) not in concluded and (a.unit, a.attempt) not in self._abandoned]

    def calibrations(self, unit: str) -> list[Calibration]:
        return [r for r in self._per_unit.get(unit, []) if isinstance(r, Calibration)]

    def calibration_status(self, unit: str, spec_sha256: str, mutants: dict | None = None) -> dict:
        """Is this exact spec (by sha256) calibrated?  The parity gate quotes this in its evidence.
        `mutants`: the unit's mutants as they are now ({scope: {name: digest}}, mutants.current_digests):
        a calibration counts only where it ran exactly those of its scope (a mutant added or changed since,
        or a `--mutant` subset, was never shown rejected)."""
        mine = self.calibrations(unit)
        current = [r for r in mine if r.spec_sha256 == spec_sha256]
        good = [r for r in current if r.ok]
        matching = [r for r in good if mutants is None or not isinstance(r.mutant_digests, dict)
                    or r.mutant_digests == mutants.get(r.mutant_scope or "all")]
        if matching:
            r = matching[-1]
            return {"calibrated": True, "record": r.hash, "time": r.time, "known_good": r.known_good,
                    "mutants_rejected": r.mutants_rejected, "mutants": r.mutants}
        if good:
            r = good[-1]
            now = mutants.get(r.mutant_scope or "all", {})
            ran = r.mutant_digests
            new = sorted(n for n in now if n not in ran or ran[n] != now[n])
            return {"calibrated": False, "reason": (
                f"its mutants changed since it was last calibrated ({len(ran)} run; not run as they are now: "
                f"{', '.join(new) or 'none'}; gone: {', '.join(sorted(set(ran) - set(now))) or 'none'}): "
                "run `porter calibrate`")[:300]}
        if current:
            return {"calibrated": False, "reason": f"last calibration failed: {current[-1].summary}"[:300]}
        if mine:
            return {"calibrated": False, "reason": "spec changed since it was last calibrated"}
        return {"calibrated": False, "reason": "never calibrated (run `porter calibrate`)"}
