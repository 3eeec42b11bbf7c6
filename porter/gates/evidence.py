"""Typed evidence: one pydantic model per gate's evidence record, written and read through it.

    evidence_of(data) -> Evidence          the record as its gate's model (by the gate's registered role)
    Model.of(data) -> Model                the record as that model (a reader that knows what it holds)
    Model.record(data) -> dict             a writer's record: validated, stamped with SCHEMA, same keys

porter.records.evidence stores a record as canonical JSON named by its sha256 and knows nothing of its
shape (records sit below the gates); this module is the shape.  Every record has the facts of
`Evidence` (gate_facts: target, unit, gate, ok, candidate_sha256, toolchain); each gate adds its own
(StaticEvidence, BuildEvidence, ParityEvidence, PerfEvidence, SpeedupEvidence, E2EEvidence), and the
sub-records readers use are typed too (a parity Timing, a perf Baseline, an e2e Verdict, ...).

Versioned and open, because evidence files are permanent (a step's commit names them by hash):
- `schema` is SCHEMA on what porter writes now; a record without one is version 0 (every record written
  before this module) and reads the same;
- a key a model does not declare is kept as it is (extra="allow"): an old record's, or a later porter's,
  reads, and a writer's record dumps to exactly the keys it was given (exclude_unset), so what lands on
  disk is what the gate wrote;
- values are checked strictly (no "yes" for True, no "3" for 3), and a record that does not fit its model
  is an EvidenceError: one line naming the field, which a command prints instead of a traceback.

Models are chosen by what the registry says a gate does (its role, what it judges), never by its name:
a new gate of an existing role reads as that role's evidence, one of a new kind as the common facts.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from porter.errors import PorterError
from porter.gates import registry

SCHEMA = 1  # the evidence version porter writes; a record without `schema` is version 0

Num = Union[int, float]  # strict: an int stays an int on disk, a float a float


def _plain(value):
    """`value` with numpy scalars as the Python values they hold: a GPU run's figures come through numpy
    and cupy, and the strict models refuse a numpy bool (an `ok` from an array comparison) and keep a numpy
    int where JSON wants an int -- on a GPU, where no CPU test reaches, a verdict would have crashed."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if item is not None and type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return item()
    return value


class EvidenceError(PorterError):
    """An evidence record that does not fit its gate's model (exit 3: not what porter writes)."""

    exit_code = 3


class Open(BaseModel):
    """A record or sub-record: its declared fields typed, every other key kept as it came."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    @classmethod
    def of(cls, data):
        """`data` (a dict, or already this model) as this model; EvidenceError when it does not fit."""
        if isinstance(data, cls):
            return data
        if isinstance(data, Open):
            data = data.dump()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise EvidenceError(f"{cls.__name__}: a record must be a JSON object, not {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise EvidenceError(_one_line(cls, data, exc)) from None

    def dump(self) -> dict:
        """The record's keys as they were given (none added, none dropped), values as they were."""
        return self.model_dump(exclude_unset=True, by_alias=True)

    def get(self, key: str, default=None):
        """A key the model does not declare (an old or a later record's), as the dict had it."""
        if key in type(self).model_fields:
            return getattr(self, key)
        return (self.model_extra or {}).get(key, default)


_BRANCHES = {"int", "float", "str", "bool", "dict", "list", "none"}


def _one_line(cls, data: dict, exc: ValidationError) -> str:
    e = exc.errors()[0]
    # a union's branch ("int", "float", a model's name) is in the path pydantic reports; the field is not
    where = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and (p in _BRANCHES or p[:1].isupper())))
    where = where or "record"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    what = f"{data.get('gate')} evidence" if isinstance(data.get("gate"), str) else "evidence"
    return f"malformed {what} ({cls.__name__}): {where}: {e['msg']}, got {repr(e.get('input'))[:60]}{more}"


# ---- sub-records -------------------------------------------------------------------------------

class Toolchain(Open):
    """What ran the gate (porter.host.toolchain): the GPU kind a verdict holds for, and where."""
    arch: str | None = None
    gpu: str | None = None
    host: str | None = None


class Device(Open):
    name: str | None = None


class Timing(Open):
    """One timed case of a parity run (the known-good's, in a calibration's record)."""
    case: str | None = None
    median_ms: Num | None = None
    roofline_ms: Num | None = None
    times_ms: list[Num] | None = None
    perf_floor: Num | None = None


class PerfLimit(Open):
    limit: Num | None = None
    spread: Num | None = None
    basis: str | None = None


class Regime(Open):
    name: str | None = None
    fresh_process: bool | None = None


class SpecRef(Open):
    file: str | None = None
    sha256: str | None = None


class FileRef(Open):
    path: str | None = None
    sha256: str | None = None


class ArchRun(Open):
    """One required architecture's run in a record across several (porter.gates.archs.across)."""
    measured: bool | None = None
    ok: bool | None = None
    summary: str | None = None
    why: str | None = None
    evidence: dict | None = None


class Baseline(Timing):
    """The known-good's timing a perf verdict was judged against (porter.gates.perf.baseline)."""
    calibration_record: str | None = None
    known_good: Any = None
    perf_limit: PerfLimit | None = None
    regime: str | None = None
    gpu: str | None = None
    arch: str | None = None
    cases: dict[str, Timing] | None = None


class PerfCase(Open):
    """One timed case's verdict in a perf record's `cases`."""
    case: str | None = None
    ok: bool | None = None
    skipped: bool | None = None
    decided_by: str | None = None
    ratio: Num | None = None
    limit: Num | None = None
    median_ms: Num | None = None
    baseline_ms: Num | None = None
    floor_ms: Num | None = None


class Decision(Open):
    """The speedup gate's A/B decision (porter.optimize.decide)."""
    old_median_ms: Num | None = None
    new_median_ms: Num | None = None
    p_value: Num | None = None
    wins: bool | None = None
    verdict: str | None = None


class E2EVerdict(Open):
    ok: bool | None = None
    reason: str | None = None
    stage: str | None = None


class WithCandidate(Open):
    """The unit and candidate an optimize step's e2e run built the backend with."""
    unit: str | None = None
    candidate_sha256: str | None = None


# ---- one model per gate's evidence -------------------------------------------------------------

class Evidence(Open):
    """What every record has (porter.records.evidence.gate_facts, REQUIRED), and what any may have."""
    schema_: int = Field(0, alias="schema")
    target: str | None = None
    unit: str | None = None
    gate: str | None = None
    ok: bool | None = None
    skipped: bool | None = None
    candidate_sha256: str | None = None
    toolchain: Toolchain | None = None
    summary: str | None = None
    sandbox: str | None = None
    archs: dict[str, ArchRun] | None = None

    @property
    def version(self) -> int:
        return self.schema_

    @classmethod
    def record(cls, data: dict) -> dict:
        """A writer's record: `data` checked against the model, stamped with SCHEMA where it has no
        version, and returned as a plain dict with the keys it was given."""
        if not isinstance(data, dict):
            raise TypeError("evidence must be a dict")
        return cls.of({"schema": SCHEMA, **_plain(data)}).dump()

    @property
    def arch(self) -> str | None:
        """The GPU architecture the record's run saw (None: the host stand-in)."""
        return (self.toolchain.arch if self.toolchain else None) or None

    def passing(self, gate: str, candidate_sha256: str | None) -> bool:
        """A passing, judged (not skipped) run of `gate` on that candidate."""
        return (self.gate == gate and self.ok is True and not self.skipped
                and self.candidate_sha256 == candidate_sha256)


class StaticEvidence(Evidence):
    runtime_unit: bool | None = None


class LinkedUnit(Open):
    """One unit's file in the library a build linked (porter.gates.build: Member.facts)."""
    sha256: str | None = None
    role: str | None = None  # "candidate", "called", "placeholder", ...
    placeholder: bool | None = None


class BuildEvidence(Evidence):
    stage: str | None = None
    object_sha256: str | None = None
    object_cached: bool | None = None
    compile_seconds: Num | None = None
    others_compile_seconds: Num | None = None
    link_seconds: Num | None = None
    linked: dict[str, LinkedUnit] | None = None  # every unit's file in the library
    library: str | None = None  # the linked library's path
    compile_steps_ms: dict[str, Num] | None = None


class ParityEvidence(Evidence):
    mode: str | None = None
    library: FileRef | None = None
    device: Device | None = None
    regime: Regime | str | None = None  # {"name": ...}; a bare word in a record from before
    spec: SpecRef | None = None
    seeds: list | None = None  # hex strings; a hand-made record's may be numbers
    cases: list[dict] | None = None  # per case: its metrics per output, its timing
    timing: Timing | None = None  # the case with the most bytes: what a one-line summary names
    timed_cases: list[Timing] | None = None  # every timed case (perf judges each)
    perf_limit: PerfLimit | None = None  # a calibration's: the known-good's limit
    zero_answer_passes: list | None = None

    @property
    def regime_name(self) -> str | None:
        return self.regime.name if isinstance(self.regime, Regime) else self.regime

    @property
    def gpu(self) -> str | None:
        return self.device.name if self.device else None

    def timed(self) -> dict[str, Timing]:
        """case label -> timing, for every timed case (in the spec's order); a record from before every
        case was kept holds its one judged case."""
        out: dict[str, Timing] = {}
        for t in self.timed_cases or []:
            if t.case and t.median_ms:
                out[t.case] = t
        if self.timing is not None and self.timing.case and self.timing.median_ms:
            out.setdefault(self.timing.case, self.timing)
        return out


class PerfEvidence(Evidence):
    regime: str | None = None
    max_slowdown: Num | None = None
    decided_by: str | None = None  # "known-good" or "roofline floor"
    candidate: Timing | None = None  # the case the verdict names (the worst judged)
    baseline: Baseline | None = None
    ratio: Num | None = None  # candidate / known-good
    limit: Num | None = None
    limit_basis: str | None = None
    within_jitter_ms: Num | None = None  # past the ratio limit by this, inside perf.CROSS_PROCESS_JITTER_MS: passed
    pct_of_roofline: Num | None = None
    floor_ms: Num | None = None
    floor_fraction: Num | None = None
    cases: list[PerfCase] | None = None
    worst_case: str | None = None
    geomean_ratio: Num | None = None
    cases_judged: int | None = None
    retime: dict | None = None
    confirmed: dict | None = None


class SpeedupEvidence(Evidence):
    committed_sha256: str | None = None
    decision: Decision | None = None
    medians_ms: dict[str, list[Num]] | None = None
    case: str | None = None


class BackendEvidence(Evidence):
    """What a record of a gate judging the whole backend says of the backend it ran on (status ties a
    verdict to HEAD by the tree hash)."""

    tree_hash: str | None = None
    commit: str | None = None
    tree_matches_head: bool | None = None


class E2EEvidence(BackendEvidence):
    library: FileRef | None = None
    verdict: E2EVerdict | None = None
    error: str | None = None
    with_candidate: WithCandidate | None = None


class PhaseVerdict(Open):
    phase: str | None = None
    ok: bool | None = None
    upstream_tps: Num | None = None
    candidate_tps: Num | None = None
    ratio: Num | None = None
    margin: Num | None = None
    p_value: Num | None = None


class ThroughputVerdict(Open):
    ok: bool | None = None
    reason: str | None = None
    phases: list[PhaseVerdict] = Field(default_factory=list)


class Agreement(Open):
    """compare.logit_agreement's figures: one backend's logits against another's over `positions` rows."""

    positions: int | None = None
    mean_kld: Num | None = None
    p99_kld: Num | None = None
    max_kld: Num | None = None
    same_top: Num | None = None
    non_finite_rows: int | None = None  # rows whose divergence is infinite (the figures above are None then)


class Accuracy(Agreement):
    """porter.gates.e2e.accuracy's figures: the port against upstream over every position of a long prefill,
    upstream against itself beside them; or why there are none (skipped: upstream's side; failed: the port's)."""

    upstream_aa: Agreement | None = None
    rule: str | None = None
    skipped: str | None = None
    failed: str | None = None


class ThroughputEvidence(BackendEvidence):
    """The throughput gate's record: the engine's samples as porter saw them, and the verdict on them."""

    verdict: ThroughputVerdict | None = None
    accuracy: Accuracy | None = None  # reported beside the verdicts, never one (docs/accuracy.md)
    samples: list[dict] | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None

    def phase(self, name: str) -> PhaseVerdict | None:
        return next((p for p in (self.verdict.phases if self.verdict else []) if p.phase == name), None)


_BY_ROLE = {registry.SOURCE: StaticEvidence, registry.LIBRARY: BuildEvidence, registry.OUTPUT: ParityEvidence,
            registry.SPEED: PerfEvidence}


def model_for(gate) -> type[Evidence]:
    """The model of `gate`'s evidence, from what the registry says it does; Evidence for a gate this
    porter does not know (an old or hand-made record)."""
    g = registry.known(gate) if isinstance(gate, str) else None
    if g is None:
        return Evidence
    if g.judges == registry.BACKEND:
        return ThroughputEvidence if g.role == registry.SPEED else E2EEvidence
    if g.judges == registry.SPEEDUP:
        return SpeedupEvidence
    return _BY_ROLE.get(g.role, Evidence)


def evidence_of(data) -> Evidence:
    """A record (a dict as stored, or a model already) as its gate's model; EvidenceError when it is
    not a JSON object or does not fit."""
    if isinstance(data, Evidence):
        return data
    if not isinstance(data, dict):
        raise EvidenceError(f"an evidence record must be a JSON object, not {type(data).__name__}")
    return model_for(data.get("gate")).of(data)


def problem(data) -> str | None:
    """None when `data` reads as its gate's evidence, else the one-line reason."""
    try:
        evidence_of(data)
    except EvidenceError as exc:
        return str(exc)
    return None
