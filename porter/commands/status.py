"""`porter status`: every unit's state, derived, never read from a stored verdict.

The inputs are exactly these, and nothing else in the workspace is opened (a
hand-written runs/status.json or PROGRESS.md cannot change the answer):

1. the ledger, re-verified on every call (hash chain; Ed25519 signatures with
   the public key in ledger/signer.pub, checked against the reader's pinned
   keys; HMAC when a legacy key is set), and the witness of its last signed
   head kept outside the workspace (porter.records.witness);
2. the evidence files its step records name (each must hash to its own name);
3. the git history: commits carrying Porter-* trailers, read in one `git log`,
   and the ledger as committed at HEAD (one `git cat-file`);
4. the unit files as they are now: sha256, the placeholder marker, and the
   static gate when porter.gates.static is installed.

Per unit the state is the first that holds of:

  tampered   a ledger line of the unit fails the chain or its signature; its step
             is incomplete (no attempt, or evidence that is not exactly its
             attempt's gate records); its step seen by the witness is gone
             (rolled back); an evidence file is
             missing, edited or swapped; a commit trailer names a step or
             evidence the ledger does not hold (or that disagrees with it); a
             committed step record has no commit; or the evidence claims a
             placeholder passed
  stale      the unit file's sha256 differs from the candidate of its latest
             step (edited, stubbed or deleted after it was built/verified), or
             the static gate now rejects it
  verified   latest step is "verified" and one of its evidence files is a
             passing parity gate whose candidate_sha256 is the file's sha256
  verified (perf unmeasured)
             the same, but no passing perf evidence for the file (perf skipped
             or turned off): correct, speed never judged
  verified (unsandboxed)
             the same, but its parity evidence says the candidate ran outside
             the sandbox ("sandbox": "none", --unsafe-no-sandbox): it could
             have written anything, this status included
  built      the same with a passing build gate; also a verified step whose parity has
             no passing verdict on one of the required architectures ([cuda]
             required_archs, --require-arch): shown "built (sm_121 not measured)"
  exhausted  its attempts ran out (an "exhausted" record after the last attempt)
  failing    attempts were made, none produced a step; shown "failing (sm_121)" where
             the refusal was on that architecture
  unported   no attempt is recorded (whatever the file holds)

Per unit, `archs` says for each architecture its evidence measured, and each required one,
"verified", "failing" or "not measured" (porter.gates.archs.verdicts reads the evidence).

Exit: 3 when anything is tampered or rolled back, else 4 when a unit is stale, else 0.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from porter.host import arch as gpu_arch
from porter.records import gitops
from porter.records import signing
from porter.records import witness
from porter.errors import PorterError
from porter.records.evidence import check_evidence, evidence_problem
from porter.gates import archs as gate_archs, registry, static
from porter.gates.evidence import E2EEvidence, Evidence, EvidenceError, SpeedupEvidence, WithCandidate, evidence_of
from porter.gates.driver import Candidate, GateContext
from porter.gates.e2e.state import E2E_UNIT, prefill_line, prefill_status
from porter.gates.e2e.throughput_state import throughput_lines, throughput_status
from porter.gates.perf import speed, speed_cell, speed_line, speed_summary
from porter.records.history import Attempt, GateRecord, History, Step, UnitHistory
from porter.digest import sha256_bytes
from porter.records.ledger import LEDGER_DIR, LEDGER_FILE, Ledger, load_key
from porter.records.lock import RunLock
from porter.target.placeholder import is_placeholder
from porter.target.plan import ranked_units
from porter.commands.reverify import contradicted, reverify, reverify_table
from porter.target import Target, load_target

IN_PROGRESS = "in progress"  # a failing unit's label while a run judges its latest attempt
PERF_UNMEASURED = "verified (perf unmeasured)"
UNSANDBOXED = "verified (unsandboxed)"
VERIFIED_STATES = ("verified", PERF_UNMEASURED, UNSANDBOXED)  # where a unit's timing is its current file's
STATES = ("verified", PERF_UNMEASURED, UNSANDBOXED, "built", "stale", "tampered", "failing", "exhausted", "unported")
CRITICAL_TIERS = ("runtime", "prefill")
_AUTO = object()
EXIT_STALE = 4
REVERIFY_SAYS = ("reverify: runs this workspace's parity specs (Python) in this process, and candidate code "
                 "only inside the sandbox")


# ---- git --------------------------------------------------------------------


@dataclass
class Commit:
    sha: str
    subject: str
    trailers: dict[str, list[str]]  # lower-cased key -> values in order

    def first(self, key: str) -> str | None:
        values = self.trailers.get(key.lower())
        return values[0] if values else None


@dataclass
class GitView:
    available: bool
    reason: str | None = None
    commits: list[Commit] = field(default_factory=list)  # newest first
    ledger_blob: str | None = None  # git blob id of ledger/ledger.jsonl at HEAD (None: not committed)
    ledger_size: int = 0
    workspace: Path | None = None
    ledger_rel: str | None = None
    head: str | None = None  # the commit everything above was read at (HEAD once: a run may commit meanwhile)

    def committed_ledger(self) -> bytes:
        """The ledger as committed at the HEAD read (one `git show`; only needed when it is not a prefix of ours)."""
        return gitops.committed_blob(self.workspace, self.ledger_rel, self.head or "HEAD") or b""

    def committed_prefix(self, data: bytes) -> bool:
        """Whether the committed ledger is byte for byte the start of `data` (hashing, not reading, the blob)."""
        if self.ledger_blob is None or self.ledger_size > len(data):
            return False
        head = b"blob %d\0" % self.ledger_size
        return hashlib.sha1(head + data[: self.ledger_size]).hexdigest() == self.ledger_blob


def read_git(workspace: Path, ledger_file: Path) -> GitView:
    """Porter commits (one `git log`) and the committed ledger's blob id and size (one `git ls-tree`)."""
    root = gitops.toplevel(workspace)
    if root is None:
        return GitView(False, "the workspace is not a git repository: no step can have a commit")
    try:  # asked first, not after a HEAD probe: one git process fewer on every status
        raw = gitops.read(root, "log", "--format=%H%x1f%s%x1f%(trailers:only,unfold)%x1e", "HEAD").decode()
    except PorterError:
        if gitops.head(root) is None:
            return GitView(True, "no commits yet")
        raise
    commits = []
    for chunk in raw.split("\x1e"):
        chunk = chunk.lstrip("\n")
        if not chunk:
            continue
        sha, subject, trailer_text = (chunk.split("\x1f") + ["", ""])[:3]
        trailers: dict[str, list[str]] = {}
        for line in trailer_text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().lower().startswith("porter-"):
                trailers.setdefault(key.strip().lower(), []).append(value.strip())
        if trailers:
            commits.append(Commit(sha, subject, trailers))
    root = root.resolve()
    rel = Path(ledger_file).resolve().relative_to(root).as_posix()
    # every later read names this commit, not HEAD: a run may commit while status reads
    head = raw.lstrip("\n").split("\x1f", 1)[0] or None
    view = GitView(True, None, commits, workspace=root, ledger_rel=rel, head=head)
    entry = gitops.read(root, "ls-tree", "-l", head or "HEAD", "--", rel).decode().strip()
    if entry:  # "<mode> blob <id> <size>\t<path>"
        meta = entry.split("\t", 1)[0].split()
        if len(meta) == 4 and meta[1] == "blob":
            view.ledger_blob, view.ledger_size = meta[2], int(meta[3])
    return view


# ---- the report ---------------------------------------------------------------


@dataclass
class UnitStatus:
    unit: str
    state: str
    reason: str
    attempts: int = 0
    candidate_sha256: str | None = None  # sha256 of the unit file as it is now (None: no file)
    evidence: list[str] = field(default_factory=list)  # evidence of the latest step
    commit: str | None = None  # commit of the latest step
    tier: str | None = None
    # the latest step's timing where the unit is verified (porter.gates.perf.speed): time_ms, x_known_good,
    # pct_roofline, regime, case, decided_by, below_half
    speed: dict | None = None
    # speedups `porter optimize` landed, oldest first: attempt, x (old/new median), p_value, before_ms, after_ms
    speedups: list[dict] = field(default_factory=list)
    # per GPU architecture: "verified", "failing" or "not measured" (every required one is listed)
    archs: dict = field(default_factory=dict)
    label: str = ""  # the state as shown: "failing (sm_121)", "built (sm_121 not measured)"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class StatusReport:
    target: str
    units: list[UnitStatus]
    counts: dict
    critical_path: dict
    ledger: dict
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # tampering not tied to one unit
    # prefill, from e2e evidence whose backend tree hash is HEAD's only: state, commit, reason
    prefill: dict = field(default_factory=lambda: {"state": "unverified", "commit": None, "reason": ""})
    # the engine's tokens/s against upstream's, from throughput evidence (porter.gates.e2e.throughput_state);
    # None where the target declares no throughput benchmark
    throughput: dict | None = None

    @property
    def tampered(self) -> bool:
        return bool(self.problems) or not self.ledger["ok"] or any(u.state == "tampered" for u in self.units)

    @property
    def torn(self) -> bool:
        """The ledger ends in a torn line: not tampering (a crash leaves one), but never left standing."""
        return bool(self.ledger.get("torn"))

    @property
    def stale(self) -> bool:
        return any(u.state == "stale" for u in self.units)

    @property
    def exit_code(self) -> int:
        """3 tampered, rolled back, witness damaged or a torn ledger tail; 4 some unit is stale (its code
        is not what was verified, or it left the API header); else 0."""
        return 3 if self.tampered or self.torn else EXIT_STALE if self.stale else 0

    def unit(self, name: str) -> UnitStatus:
        for u in self.units:
            if u.unit == name:
                return u
        raise KeyError(name)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "units": [u.to_json() for u in self.units],
            "counts": self.counts,
            "critical_path": self.critical_path,
            "ledger": self.ledger,
            "problems": self.problems,
            "notes": self.notes,
            "prefill": self.prefill,
            "throughput": self.throughput,
            "speed": self.speed,
        }

    @property
    def speed(self) -> dict:
        return speed_summary([u.speed for u in self.units])


def _count(units: list[UnitStatus]) -> dict:
    counts = {s: 0 for s in STATES}
    for u in units:
        counts[u.state] += 1
    counts["total"] = len(units)
    return counts


def _ranking(target: Target) -> tuple[dict[str, tuple[str, int]] | None, str | None]:
    try:
        ranked = ranked_units(target)
    except Exception as exc:  # a broken or partial scan must not take status down
        return None, f"ranking unavailable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return {r.unit: (r.tier, r.rank) for r in ranked}, None


def _first(items: list[str]) -> str:
    return items[0] + (f" (+{len(items) - 1} more)" if len(items) > 1 else "")


def _short(sha: str | None, n: int = 12) -> str:
    return sha[:n] if isinstance(sha, str) else "-"


def _resolve_target_name(workspace: Path, name: str | None) -> str:
    if name:
        return name
    found = sorted(p.parent.name for p in (workspace / "targets").glob("*/target.toml"))
    if len(found) == 1:
        return found[0]
    raise PorterError(
        f"pass --target (targets in {workspace / 'targets'}: {', '.join(found) or 'none'})"
    )


# ---- keys: the workspace's signing key against pins and this user's key ---------------


@dataclass
class KeyState:
    public: object  # the workspace's Ed25519 public key, or None (unsigned, legacy workspace)
    fingerprint: str | None
    problems: list[str]
    notes: list[str]
    pin_note: str
    mine: bool = False  # this user's signing key is the workspace's (this machine writes its witness)


def signing_state(workspace: Path) -> KeyState:
    """What the reviewer's pins and this user's key say about the workspace's key. Only public
    material is needed: the private key is read (when present) to say "wrong key", never required."""
    public, problem = signing.load_workspace_key(workspace)
    fp = signing.fingerprint(public) if public is not None else None
    problems = [problem] if problem else []
    notes: list[str] = []
    pins = signing.trusted()
    pin_note = ""
    if pins:
        if fp is None:
            problems.append(f"you trust {', '.join(sorted(pins))} but the workspace names no signing key "
                            "(ledger/signer.pub removed: signatures stripped?)")
        elif fp not in pins:
            problems.append(f"wrong key: the workspace's signing key {fp} is not a key you trust "
                            f"({', '.join(sorted(pins))}): key swapped in the repository, or pin it with `porter trust {fp}`")
        else:
            pin_note = ", pinned"
    try:
        mine = signing.load_private(workspace)
    except PorterError as exc:
        mine, _ = None, notes.append(str(exc))
    if fp and not pins:
        if mine is not None and mine.fingerprint == fp:
            pin_note = ", your key"
        else:
            pin_note = f", not pinned: `porter trust {fp}`"
    if fp and mine is not None and mine.fingerprint != fp:
        notes.append(f"wrong key: your signing key is {mine.fingerprint}, this workspace's is {fp} "
                     "(`porter run` here would refuse to write)")
    return KeyState(public, fp, problems, notes, pin_note, bool(fp and mine is not None and mine.fingerprint == fp))


def _key_history_problems(keys: KeyState, integ, gitv: GitView) -> list[str]:
    """A workspace that names no key now while its history shows it had one: signatures stripped
    and ledger/signer.pub removed is tampered whatever this machine holds (no pin, no witness)."""
    if keys.fingerprint is not None or integ.sig_signed or not gitv.head or not gitv.ledger_rel:
        return []
    rel = gitv.ledger_rel.removesuffix(LEDGER_FILE) + signing.WORKSPACE_KEY.removeprefix(f"{LEDGER_DIR}/")
    sha = gitops.last_commit_touching(gitv.workspace, gitv.head, rel)
    if sha is None:
        return []
    return [f"the workspace names no key, but {signing.WORKSPACE_KEY} was committed (commit {sha[:10]}): "
            "signatures stripped and the key removed?"]


# ---- integrity: ledger, commits and evidence agree -------------------------------


@dataclass
class Integrity:
    """What the cross-checks found: tampering per unit and not tied to a unit, and which steps have commits."""

    issues: dict[str, list[str]]
    problems: list[str]
    ledger_problems: list[str]
    commit_of_step: dict[str, Commit]
    committed_lines: int


class EvidenceCache:
    """sha -> (the record as its gate's model, None) when ledger/evidence/<sha>.json is intact and reads as
    its gate's evidence (porter.gates.evidence), else (None, the one-line problem): each file read once."""

    def __init__(self, workspace: Path):
        self.workspace = workspace
        self._seen: dict[str, tuple[Evidence | None, str | None]] = {}

    def __call__(self, sha: str) -> tuple[Evidence | None, str | None]:
        if sha not in self._seen:
            data, problem = check_evidence(self.workspace, sha)
            typed = None
            if problem is None:
                try:
                    typed = evidence_of(data)
                except EvidenceError as exc:
                    problem = f"evidence {sha[:12]} is not what porter writes: {exc}"
            self._seen[sha] = (typed, problem)
        return self._seen[sha]


def check_integrity(target: Target, history: History, ledger_integrity, data: bytes, gitv: GitView,
                    evidence: EvidenceCache, rollback: tuple[list[str], dict[str, str]] = ([], {}),
                    former_units: list[str] = ()) -> Integrity:
    found = _Found(set(target.units) | set(former_units))
    ledger_problems, committed_lines = _ledger_against_head(ledger_integrity, data, gitv)
    ledger_problems += rollback[0]
    for unit, text in rollback[1].items():
        found.flag(unit, text)
    for lineno, text in ledger_integrity.bad_lines.items():
        rec = history.by_line.get(lineno)
        if rec is not None and (rec.target or target.name) == target.name and isinstance(rec.unit, str):
            found.flag(rec.unit, f"ledger {text}")
    commit_of_step = _commits_against_steps(target, history.steps, gitv, evidence, found)
    _steps_against_commits_and_evidence(target, history, commit_of_step, committed_lines, evidence, found)
    _refused_attempts_evidence(history, found)
    latest = {}  # the step each unit's state rests on, when committed: its commit must hold what it names
    for step_hash, step in history.steps.items():
        if step_hash in commit_of_step and history.unit(step.unit).last_step is step:
            latest[step_hash] = commit_of_step[step_hash]
    for step_hash, text in _commits_lacking_files(gitv, history.steps, latest).items():
        found.flag(history.steps[step_hash].unit, text)
    return Integrity(dict(found.issues), found.problems, ledger_problems, commit_of_step, committed_lines)


class _Found:
    """What check_integrity finds: per unit of this target (former ones included), or about the workspace."""

    def __init__(self, units: set[str]):
        self.units = units
        self.issues: dict[str, list[str]] = defaultdict(list)
        self.problems: list[str] = []

    def flag(self, unit: str | None, text: str) -> None:
        if unit in self.units:
            self.issues[unit].append(text)
        else:
            self.problems.append(text if unit is None else f"{unit}: {text}")


def _ledger_against_head(ledger_integrity, data: bytes, gitv: GitView) -> tuple[list[str], int]:
    """(the ledger's problems, how many of its lines HEAD committed): the working ledger must extend the
    committed one, never rewrite it."""
    problems = list(ledger_integrity.problems)
    if gitv.ledger_blob is None:
        return problems, 0
    if gitv.committed_prefix(data):
        return problems, data[: gitv.ledger_size].count(b"\n")
    ours, theirs = data.split(b"\n"), gitv.committed_ledger().split(b"\n")
    n = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    problems.append(f"ledger.jsonl differs from the one committed at HEAD from line {n + 1} (committed lines "
                    "rewritten or removed)")
    return problems, n


def _commits_against_steps(target: Target, steps: dict[str, Step], gitv: GitView, evidence: EvidenceCache,
                           found: _Found) -> dict[str, Commit]:
    """Each step commit's trailers against the step record it names; returns step hash -> its newest commit."""
    commit_of_step: dict[str, Commit] = {}
    for c in gitv.commits:  # newest first
        unit = c.first("Porter-Unit")
        ctarget = c.first("Porter-Target")
        if unit is None and c.first("Porter-Step") is None:
            continue  # not a step commit (other Porter-* trailers may come later)
        if (ctarget is not None and ctarget != target.name) or (ctarget is None and unit not in found.units):
            continue
        where = f"commit {c.sha[:10]}"
        step_hash = c.first("Porter-Step")
        step = steps.get(step_hash) if step_hash else None
        if step is None:
            found.flag(unit, f"{where} names step {_short(step_hash)} that is not in the ledger (step record deleted "
                             "or trailer rewritten)")
            continue
        commit_of_step.setdefault(step_hash, c)
        for label, got, want in (
            ("Porter-Unit", unit, step.unit),
            ("Porter-State", c.first("Porter-State"), step.state),
            ("Porter-Candidate", c.first("Porter-Candidate"), step.candidate_sha256),
        ):
            if got != want:
                found.flag(step.unit, f"{where} trailer {label}: {_short(got)} disagrees with its step record "
                                      f"({_short(want)})")
        trailer_ev = c.trailers.get("porter-evidence", [])
        if sorted(trailer_ev) != sorted(step.evidence):
            extra = [e for e in trailer_ev if e not in step.evidence]
            what = f"names evidence {_short(extra[0])} not in its step record" if extra else \
                "lacks evidence its step record names"
            found.flag(step.unit, f"{where} trailer Porter-Evidence {what} (trailer rewritten?)")
        for sha in trailer_ev:
            _, problem = evidence(sha)
            if problem:
                found.flag(step.unit, f"{where}: {problem}")
    return commit_of_step


def _steps_against_commits_and_evidence(target: Target, history: History, commit_of_step: dict[str, Commit],
                                        committed_lines: int, evidence: EvidenceCache, found: _Found) -> None:
    """Each live step record: complete, committed once HEAD holds its line, its evidence intact and about
    this unit's candidate (an optimize step's e2e run about the backend built with it)."""
    by_unit_attempt: dict = {}
    for step_hash, step in history.steps.items():
        if step_hash in history.abandoned_steps:
            continue
        for text in _incomplete(history, step, by_unit_attempt):
            found.flag(step.unit, text)
        if step_hash not in commit_of_step and step.line <= committed_lines:
            found.flag(step.unit, f"step record at ledger line {step.line} (attempt {step.attempt}, {step.state}) "
                                  "has no commit (commit dropped?)")
        for sha in step.evidence:
            ev, problem = evidence(sha)
            if problem:
                found.flag(step.unit, problem)
            elif isinstance(ev, E2EEvidence) and ev.unit == E2E_UNIT and ev.target == target.name:
                # an optimize step carries the e2e run of the backend built with its candidate
                ran = ev.with_candidate or WithCandidate()
                if ran.unit != step.unit or ran.candidate_sha256 != step.candidate_sha256:
                    found.flag(step.unit, f"e2e evidence {sha[:12]} ran the backend with "
                                          f"{ran.unit or 'no unit'}'s candidate {_short(ran.candidate_sha256)}, "
                                          f"not this step's {_short(step.candidate_sha256)} (swapped)")
            elif ev.unit != step.unit or ev.target != target.name:
                found.flag(step.unit, f"evidence {sha[:12]} is for {ev.target}/{ev.unit}, not this unit (swapped)")
            elif ev.candidate_sha256 != step.candidate_sha256:
                found.flag(step.unit, f"evidence {sha[:12]} judged candidate {_short(ev.candidate_sha256)}, not the "
                                      f"step's {_short(step.candidate_sha256)}")


def _refused_attempts_evidence(history: History, found: _Found) -> None:
    """Refused attempts' evidence too (the audit and the report quote it): intact is enough, since the signed
    gate record names it by hash (parsing 4k files would double status's time)."""
    step_evidence = {e for s in history.steps.values() for e in s.evidence}
    for g in history.mine:
        if isinstance(g, GateRecord) and g.evidence is not None and g.evidence not in step_evidence:
            problem = evidence_problem(history.workspace, g.evidence)
            if problem:
                found.flag(g.unit, f"{g.gate} gate record at ledger line {g.line}: {problem}")


def _commits_lacking_files(gitv: GitView, steps: dict[str, Step], commit_of_step: dict[str, Commit]) -> dict[str, str]:
    """Step hash -> problem, for each step commit whose tree does not hold the unit file the step
    judged and every evidence file it names (an empty commit carrying the right trailers, or one
    made beside files that were never committed). One `git cat-file --batch` for all of them."""
    # tree paths are relative to the repository root; the workspace may be a folder inside it
    prefix = (gitv.ledger_rel or "").removesuffix(f"{LEDGER_DIR}/{LEDGER_FILE}")
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for step_hash, c in commit_of_step.items():
        step = steps[step_hash]
        rel = step.unit_file if isinstance(step.unit_file, str) else ""
        files = [(rel, str(step.candidate_sha256), "unit file")]
        files += [(f"ledger/evidence/{e}.json", e, "evidence") for e in step.evidence if isinstance(e, str)]
        wanted[step_hash] = [(f"{c.sha}:{prefix}{path}", sha, what) for path, sha, what in files]
    if not wanted:
        return {}
    blobs = gitops.read_blobs(gitv.workspace, [spec for specs in wanted.values() for spec, _, _ in specs])
    out = {}
    for step_hash, specs in wanted.items():
        for spec, sha, what in specs:
            blob = blobs.get(spec)
            if blob is None or sha256_bytes(blob) != sha:
                how = "lacks" if blob is None else "holds another"
                out[step_hash] = (f"commit {commit_of_step[step_hash].sha[:10]} does not hold the {what} its step names: "
                                  f"it {how} {spec.split(':', 1)[1][len(prefix):]} (an empty or hollow commit with the step's trailers)")
                break
    return out


def _incomplete(history: History, step: Step, index: dict) -> list[str]:
    """What a step lacks behind it: its attempt record (same candidate) and exactly the gate records
    of that attempt since the attempt (or since the attempt's previous step, for a built step
    re-verified later), all passing, naming the evidence the step names, including the gate its
    state needs. A step forged on its own, or one whose gate records were removed, fails here."""
    where = f"step record at ledger line {step.line} (attempt {step.attempt}, {step.state})"
    by_attempt = index.get(step.unit)
    if by_attempt is None:  # one pass over the unit's records for all its steps (status runs this per step)
        by_attempt = index[step.unit] = {}
        for r in history.unit(step.unit).records:
            if isinstance(r, (Attempt, GateRecord, Step)):
                by_attempt.setdefault(r.attempt if isinstance(r.attempt, int) else None, []).append(r)
    mine = by_attempt.get(step.attempt if isinstance(step.attempt, int) else None, [])
    attempt = next((a for a in reversed(mine) if isinstance(a, Attempt) and a.line < step.line), None)
    if attempt is None:
        return [f"{where} has no attempt record behind it (step forged?)"]
    out = []
    if attempt.candidate_sha256 != step.candidate_sha256:
        out.append(f"{where} candidate {_short(step.candidate_sha256)} is not its attempt's "
                   f"({_short(attempt.candidate_sha256)})")
    since = max([attempt.line] + [s.line for s in mine if isinstance(s, Step) and s.line < step.line])
    gates = [g for g in mine if isinstance(g, GateRecord) and since < g.line < step.line]
    named = [g.evidence for g in gates]
    extra = [e for e in step.evidence if e not in named]
    if extra:
        out.append(f"{where} names evidence {_short(extra[0])} that no gate record of its attempt holds "
                   "(gate records removed, or evidence added)")
    left_out = [g for g in gates if g.evidence not in step.evidence]
    if left_out:
        out.append(f"{where} leaves out the {left_out[0].gate} gate record at line {left_out[0].line}")
    refused = next((g for g in gates if not g.ok and not g.skipped), None)
    if refused is not None:
        out.append(f"{where} follows a failed {refused.gate} gate (line {refused.line})")
    need = next((n for n in registry.proof_of(step.state)
                 if not any(g.gate == n and g.ok and not g.skipped for g in gates)), None)
    if need:
        out.append(f"{where} has no passing {need} gate record behind it")
    return out


# ---- one unit's state: a pure function of its history, its file and the checks above ----


@dataclass(frozen=True)
class UnitFile:
    """The unit file as it is now."""

    sha256: str | None  # None: no file
    placeholder: bool = False
    static_problem: str | None = None  # the static gate's refusal of the file now


def unit_file(target: Target, unit: str, use_static: bool) -> UnitFile:
    try:
        data = target.unit_path(unit).read_bytes()
    except FileNotFoundError:
        return UnitFile(None)
    text = data.decode("utf-8", "replace")
    placeholder = is_placeholder(text)
    problem = None
    if use_static and not placeholder:
        try:
            res = static.run(Candidate.of(unit, text), GateContext(target))
            if not res.ok and not res.skipped:
                problem = res.summary
        except Exception as exc:  # a gate bug must not hide the other units
            problem = f"static gate error: {type(exc).__name__}: {exc}"
    return UnitFile(sha256_bytes(data), placeholder, problem)


def unit_state(uh: UnitHistory, f: UnitFile, tampered: list[str], evidence, committed: set[str],
               required: tuple[str, ...] = ()) -> tuple[str, str]:
    """(state, reason) of one unit; the first of the module docstring's states that holds.  `required`:
    the architectures a verification must hold on (Target.required_archs)."""
    if tampered:
        return "tampered", _first(tampered)
    step = uh.last_step
    if step is not None:
        state, reason = _from_step(uh, step, f, evidence, committed, required)
        refuted = uh.refutation
        if state == "built" and refuted is not None:
            # committed before parity could run; parity (or perf) has since refused this very file
            state = "exhausted" if uh.exhausted else "failing"
            reason = (f"the built file (attempt {step.attempt}) failed {refuted.gate}: {refuted.summary}"
                      + ("; attempts used up" if uh.exhausted else ""))
        return state, reason
    n = len(uh.attempts)
    if n == 0:
        if f.sha256 is None:
            return "unported", "no unit file, no attempt"
        if f.placeholder:
            return "unported", "placeholder, no attempt"
        if f.static_problem:
            return "unported", f"no attempt recorded; the file fails the static gate: {f.static_problem}"
        return "unported", "the file is not a placeholder but no attempt is recorded (hand-written: unverified)"
    last = uh.failures[-1] if uh.failures else None
    why = (f"attempt {last.attempt}: {last.gate}: {last.summary}" if last
           else "no gate result recorded (run in progress or interrupted)")
    if uh.exhausted:
        return "exhausted", f"{n} attempts used up; last {why}"
    return "failing", f"{n} attempt{'s' if n != 1 else ''}; last {why}"


def _from_step(uh: UnitHistory, step: Step, f: UnitFile, evidence, committed: set[str],
               required: tuple[str, ...] = ()) -> tuple[str, str]:
    state, cand, when = step.state, step.candidate_sha256, f"attempt {step.attempt}"
    proof_gates = registry.proof_of(state)  # the gates whose passing evidence this state stands on
    if not proof_gates:
        return "tampered", f"step record at ledger line {step.line} has unknown state {state!r}"
    if f.sha256 is None:
        return "stale", f"unit file deleted after it was {state} ({when})"
    if f.sha256 != cand:
        now = ("now a placeholder" if f.placeholder else
               f"now fails the static gate: {f.static_problem}" if f.static_problem else "edited")
        return "stale", (f"unit file changed after it was {state} ({when}): {now}; "
                         f"file {f.sha256[:12]} != evidence candidate {_short(cand)}")
    if f.placeholder:
        return "tampered", f"evidence says a placeholder was {state} ({when})"
    if f.static_problem:
        return "stale", f"the static gate now rejects the {state} candidate: {f.static_problem}"
    proofs = {gate: _passing(step, gate, f.sha256, evidence) for gate in proof_gates}
    gate = next((g for g, sha in proofs.items() if sha is None), None)
    if gate is not None:
        return "tampered", f"step claims {state} ({when}) but none of its evidence is a passing {gate} gate for this file"
    # the evidence the reason and the GPU kinds quote: a gate's that ran the candidate (parity), where one counts
    gate = next((g for g in proof_gates if registry.get(g).runs_candidate), proof_gates[0])
    proof = proofs[gate]
    reason = f"{gate} evidence {proof[:12]} matches the current file ({when})"
    if state == registry.BUILT:
        reason += f"; no {' / '.join(registry.proof_of(registry.VERIFIED))} evidence yet"
    later = [a for a in uh.attempts if a.line > step.line]
    if later:
        reason += f"; {len(later)} later attempt{'s' if len(later) != 1 else ''} without a step"
    if step.hash not in committed:
        reason += "; not committed yet (run in progress or interrupted)"
    if state == "verified":
        reason += _ran_on(evidence(proof)[0])
        missing = unmeasured(evidence(proof)[0], required)
        if missing:
            # a verdict holds for the GPU kinds it ran on: one required kind without it is no verification
            return "built", (reason + f"; {', '.join(missing)} not measured (required; no passing parity on a "
                             "GPU of that kind): not verified")
    if state == "verified" and evidence(proof)[0].sandbox == "none":
        return UNSANDBOXED, reason + "; the candidate ran outside the sandbox (--unsafe-no-sandbox)"
    if state == "verified" and not all(_passing(step, g, f.sha256, evidence)  # perf
                                       for g in registry.names(registry.UNIT, role=registry.SPEED)):
        return PERF_UNMEASURED, reason + "; no passing perf evidence (perf skipped or off)"
    return state, reason


def _passing(step: Step, gate: str, sha256: str, evidence) -> str | None:
    """The step's first evidence record of a passing `gate` run on this file content, or None."""
    return next((sha for sha in step.evidence if (ev := evidence(sha)[0]) and ev.passing(gate, sha256)), None)


def unmeasured(parity_evidence: dict | Evidence | None, required: tuple[str, ...]) -> list[str]:
    """The required architectures a parity evidence record holds no passing verdict for."""
    got = gate_archs.verdicts(parity_evidence)
    return [a for a in required if got.get(a) is not True]


def _ran_on(ev: Evidence | None) -> str:
    """"; parity ran on sm_121 (NVIDIA GB10, host spark-2)": the GPU kind a verification holds for, from
    its parity evidence (the host and GPU the worker's harness named, the architecture the child saw);
    "; parity passed on sm_90, sm_121" for a run on several required kinds."""
    ev = ev if isinstance(ev, Evidence) else Evidence()
    if ev.archs is not None:
        passed = [a for a, ok in gate_archs.verdicts(ev).items() if ok]
        return f"; parity passed on {', '.join(passed)}" if passed else ""
    tc = ev.toolchain
    arch, gpu, host = (tc.arch, tc.gpu, tc.host) if tc is not None else (None, None, None)
    if not arch:
        return ""
    said = ", ".join(x for x in (str(gpu) if gpu else "", f"host {host}" if host else "") if x)
    return f"; parity ran on {arch}" + (f" ({said})" if said else "")


def derive(
    workspace: Path,
    target_name: str | None = None,
    source: str | Path | None = None,
    key=_AUTO,
    use_static: bool = True,
    target: Target | None = None,
    rank: bool = True,
    prefill: bool = True,
) -> StatusReport:
    """Derive every unit's state from the ledger, evidence, git history and current files."""
    workspace = Path(workspace).resolve()
    if target is None:
        target = load_target(workspace, _resolve_target_name(workspace, target_name), source)
    if key is _AUTO:
        key = load_key(workspace)
    keys = signing_state(workspace)
    ledger = Ledger(workspace, key, public=keys.public)
    # One instant for a run in flight: git first (a commit landing later only holds a ledger that is a
    # prefix of the one read next), then the ledger and the witness under the ledger's shared lock
    # (an append, which also moves the witness, waits for it).
    gitv = read_git(workspace, ledger.path)
    with ledger.reading():
        scan = ledger.scan()
        genesis = scan.entries[0][1].get("hash") if scan.entries else None
        w, by_path, w_health = witness.load(workspace, genesis, expected=keys.mine and scan.integrity.sig_signed > 0)
    if keys.fingerprint is None and not scan.integrity.sig_signed:
        w_health = {"state": "unsigned", "path": None}
    history = History.from_scan(scan, target.name, workspace)
    notes = list(scan.integrity.notes) + ([gitv.reason] if gitv.reason else []) + keys.notes
    evidence = EvidenceCache(workspace)
    w_problems, w_units = witness.check(w, by_path, scan.entries, keys.fingerprint, target.name)
    damaged = witness.health_problem(w_health)
    w_problems = ([damaged] if damaged else []) + w_problems
    former = sorted(u for u in {s.unit for s in history.steps.values() if isinstance(s.unit, str)} - set(target.units)
                    if history.unit(u).last_step is not None)
    integ = check_integrity(target, history, scan.integrity, scan.data, gitv, evidence,
                            (keys.problems + _key_history_problems(keys, scan.integrity, gitv) + w_problems, w_units),
                            former_units=former)

    ranking, ranking_reason = _ranking(target) if rank else (None, "not ranked")
    running = RunLock(workspace).held_elsewhere()  # a run is active: a verdict-less attempt is in progress
    results: list[UnitStatus] = []
    for unit in target.units:
        uh = history.unit(unit)
        f = unit_file(target, unit, use_static)
        state, reason = unit_state(uh, f, integ.issues.get(unit, []), evidence, set(integ.commit_of_step),
                                   target.required_archs)
        st = UnitStatus(unit=unit, state=state, reason=" ".join(reason.split()), attempts=len(uh.attempts),
                        candidate_sha256=f.sha256)
        st.archs = arch_states(uh, state, f, evidence, target.required_archs)
        st.label = unit_label(state, st.archs)
        if running and state == "failing" and (n := attempt_in_progress(uh)) is not None:
            st.label = IN_PROGRESS  # still failing (no step yet), but not judged so: its verdict is coming
            st.reason = f"attempt {n} in progress (a porter run holds the workspace's run lock)" + (
                f"; before it: {st.reason}" if uh.failures else "")
        if ranking is not None and unit in ranking:
            st.tier = ranking[unit][0]
        if uh.last_step is not None:
            st.evidence = list(uh.last_step.evidence)
            commit = integ.commit_of_step.get(uh.last_step.hash)
            st.commit = commit.sha if commit else None
            if state in VERIFIED_STATES:
                st.speed = speed([evidence(sha)[0] for sha in st.evidence])
        st.speedups = speedups_landed(uh, evidence)
        results.append(st)
    for unit in former:  # reported, not dropped: a unit cannot leave status by leaving the header
        last = history.unit(unit).last_step
        tampered = integ.issues.get(unit)
        results.append(UnitStatus(
            unit=unit, state="tampered" if tampered else "stale", attempts=len(history.unit(unit).attempts),
            reason=_first(tampered) if tampered else (f"its declaration left the API header "
                                                      f"({target.api_header.name}) after it was {last.state} "
                                                      f"(attempt {last.attempt}): nothing checks it now"),
            evidence=list(last.evidence)))

    if ranking is not None:
        results.sort(key=lambda u: (ranking.get(u.unit, ("~", 1 << 30))[1]))
        critical_units = [u for u in results if u.tier in CRITICAL_TIERS]
        critical = {"available": True, "reason": None, "tiers": list(CRITICAL_TIERS),
                    "units": [u.unit for u in critical_units], "counts": _count(critical_units)}
    else:
        critical = {"available": False, "reason": ranking_reason, "tiers": list(CRITICAL_TIERS), "units": [], "counts": None}

    li = scan.integrity
    key_line = li.key_state() + keys.pin_note
    rolled = ([p for p in w_problems if p.startswith(("rolled back", "witness "))]
              + [f"{u}: {t}" for u, t in w_units.items()])
    ledger_info = {"records": li.records, "ok": not integ.ledger_problems, "keyed": li.keyed, "key": key_line,
                   "fingerprint": keys.fingerprint, "rolled_back": rolled, "witness": w_health, "torn": list(li.torn),
                   "problems": integ.ledger_problems, "notes": list(li.notes), "committed_records": integ.committed_lines}
    p_state, p_commit, p_reason = (prefill_status(workspace, target, history.mine) if prefill
                                   else ("unverified", None, "not derived"))
    engine_speed = (throughput_status(workspace, target, history.mine)
                    if prefill and target.spec.e2e is not None and target.spec.e2e.throughput is not None else None)
    return StatusReport(target=target.name, units=results, counts=_count(results), critical_path=critical,
                        ledger=ledger_info, notes=notes, problems=integ.problems,
                        prefill={"state": p_state, "commit": p_commit, "reason": p_reason},
                        throughput=engine_speed)


def _judging_evidence(uh: UnitHistory, state: str, f: UnitFile, evidence) -> list[Evidence]:
    """The evidence a unit's state rests on, as far as GPU kinds go: the latest step's parity (and perf)
    for the current file where it is verified or built; the refusing gate's where it is failing."""
    if state in VERIFIED_STATES or state == "built":
        step = uh.last_step
        ran = registry.names(registry.UNIT, runs_candidate=True)  # parity and perf: they ran it on a GPU
        return [ev for sha in (step.evidence if step else []) if (ev := evidence(sha)[0])
                and ev.gate in ran and ev.candidate_sha256 == f.sha256]
    if state in ("failing", "exhausted") and uh.failures:
        last = uh.refutation or uh.failures[-1]
        return [ev for g in uh.gates_of(last.attempt) if g.gate == last.gate and not g.ok and g.evidence
                and (ev := evidence(g.evidence)[0])]
    return []


def arch_states(uh: UnitHistory, state: str, f: UnitFile, evidence, required: tuple[str, ...]) -> dict[str, str]:
    """{arch: "verified" | "failing" | "not measured"}: each GPU kind the evidence under the state measured
    (a kind passes only where every gate that measured it passed), and each required kind."""
    out: dict[str, str] = {}
    if state != "tampered":
        for ev in _judging_evidence(uh, state, f, evidence):
            for a, ok in gate_archs.verdicts(ev).items():
                out[a] = "failing" if not ok or out.get(a) == "failing" else "verified"
    if state == "built":  # a build alone measures no kind; a verified step's parity did
        out = {a: s for a, s in out.items() if s == "verified"}
    for a in required:
        out.setdefault(a, "not measured")
    return dict(sorted(out.items(), key=lambda kv: gpu_arch.order(kv[0])))


def attempt_in_progress(uh: UnitHistory) -> int | None:
    """The unit's last attempt when nothing came after it (no verdict, no step, not abandoned): in
    progress while a run holds the lock, interrupted otherwise."""
    last = uh.attempts[-1] if uh.attempts else None
    if last is None or last not in uh.live_attempts:
        return None
    after = [r for r in (*uh.failures, *uh.all_steps, *uh._exhausted) if r.line > last.line]
    return None if after else last.attempt


def unit_label(state: str, archs: dict[str, str]) -> str:
    """The state as a person reads it: "failing (sm_121)" for a refusal on that kind, "built (sm_121 not
    measured)" where a required kind has no verdict (a step whose parity ran on the other kinds only, or
    one recorded verified before a kind was required); else state_label(state)."""
    failing = [a for a, s in archs.items() if s == "failing"]
    missing = [a for a, s in archs.items() if s == "not measured"]
    if state in ("failing", "exhausted") and failing:
        return f"{state} ({', '.join(failing)})"
    if state == "built" and missing:
        return f"built ({', '.join(missing)} not measured)"
    return state_label(state)


def speedups_landed(uh, evidence) -> list[dict]:
    """The speedup gate's passing evidence among the live steps' own evidence (what was committed)."""
    judges = registry.names(registry.SPEEDUP)
    won = {g.attempt for g in uh.gates if g.gate in judges and g.ok}
    out = []
    for step in uh.steps:
        if step.attempt not in won:
            continue
        for sha in step.evidence:
            ev = evidence(sha)[0]
            d = ev.decision if isinstance(ev, SpeedupEvidence) else None
            if d is not None and ev.gate in judges and ev.ok is True and d is not None and d.new_median_ms:
                out.append({"attempt": step.attempt, "x": d.old_median_ms / d.new_median_ms,
                            "p_value": d.p_value, "before_ms": d.old_median_ms,
                            "after_ms": d.new_median_ms, "evidence": sha})
    return out


def speedups_line(units) -> str | None:
    """'speedups landed: unit 2.9x (p=5.4e-06); ...', or None when none."""
    parts = [f"{u.unit} " + ", ".join(f"{s['x']:.2f}x (p={s['p_value']:.2g})" for s in u.speedups)
             for u in units if u.speedups]
    return "speedups landed: " + "; ".join(parts) if parts else None


def tamper_check(workspace: Path, target: Target, key) -> tuple[str, str] | None:
    """What `porter run` asks before it appends to the ledger: None, or ('tampered' | 'rolled back', the
    first problem).  The ledger, git, the witness and each unit's records, without the static scan,
    the ranking or the prefill line (none of them can make a workspace tampered)."""
    report = derive(workspace, key=key, use_static=False, target=target, rank=False, prefill=False)
    if not report.tampered:
        return None
    led = report.ledger
    first = (led["problems"] + report.problems + [f"{u.unit}: {u.reason}" for u in report.units if u.state == "tampered"])[0]
    return ("rolled back" if led.get("rolled_back") else "tampered"), first


# ---- CLI ------------------------------------------------------------------------

# Terminal colours: success colours only for what a GPU measured. `built` compiled and nothing more
# (a CPU-only run ends every unit there, wrong answers included), so it is neutral, never green.
STATE_STYLE = {
    "verified": "bold green",
    PERF_UNMEASURED: "green",
    UNSANDBOXED: "yellow",
    "built": "",
    "stale": "yellow",
    "tampered": "bold red",
    "failing": "red",
    "exhausted": "magenta",
    "unported": "dim",
}
# How a state is shown to a person (the state itself, in --json and the ledger, is unchanged).
STATE_LABEL = {"built": "built (not judged)"}  # short: it fits status at 80 columns beside minimoe's names


def state_label(state: str) -> str:
    return STATE_LABEL.get(state, state)


def counts_line(counts: dict, in_progress: int = 0) -> str:
    """"3 verified, 1 failing, ...": `in_progress` of the failing units are shown as in progress."""
    parts = []
    for s in STATES:
        n = counts.get(s, 0) - (in_progress if s == "failing" else 0)
        if n > 0:
            parts.append(f"{n} {state_label(s)}")
        if s == "failing" and in_progress:
            parts.append(f"{in_progress} {IN_PROGRESS}")
    return ", ".join(parts) or "none"


def status_columns(ranked: bool, timed: bool = False) -> list:
    """The status table's columns, in order; the reason is the table's tail (term.Table).  `timed`: some
    unit has a timing, shown in a speed column (perf.speed_cell: time, x known-good, % of roofline,
    regime) that gives way like the commit."""
    from porter.term import Column

    return ([Column("unit", key=True)] + ([Column("tier")] if ranked else [])
            + [Column("state"), Column("att", right=True)] + ([Column("speed", give_way=True)] if timed else [])
            + [Column("commit", give_way=True)])


def status_table(report: StatusReport):
    from rich.text import Text

    from porter.term import Table

    ranked = report.critical_path["available"]
    timed = any(u.speed for u in report.units)
    table = Table(status_columns(ranked, timed), tail="reason", title=f"porter status: {report.target}")
    for u in report.units:
        # Text, not markup: reasons quote ledger and compiler text
        fast = [Text(speed_cell(u.speed), style="red" if (u.speed or {}).get("below_half") else None)] if timed else []
        style = "cyan" if u.label == IN_PROGRESS else STATE_STYLE[u.state]
        table.add_row(u.unit, *([u.tier or ""] if ranked else []), Text(u.label or state_label(u.state), style=style),
                      str(u.attempts), *fast, u.commit[:10] if u.commit else "", tail=u.reason)
    return table


def render(report: StatusReport, console=None, wide: bool = False) -> None:
    if console is None:
        from porter.term import console as make_console

        console = make_console(wide)

    def say(text: str, style: str | None = None) -> None:
        console.print(text, style=style, markup=False, highlight=False)

    # first, before the table: what limits every line below it (an empty ledger, a new workspace, has no
    # history to roll back: its witness starts with the first record, said on the ledger line)
    w = report.ledger.get("witness") or {}
    if w.get("state") in ("missing", "empty", "corrupt"):
        say(f"witness: {w['state'].upper()} ({w.get('path')}): a rollback cannot be ruled out; exit 3", "bold red")
    elif w.get("state") == "none" and report.ledger.get("records"):
        say(f"witness: none for this ledger on this machine ({witness.witness_dir()}): a rollback cannot be seen here")
    for t in report.ledger.get("torn") or []:
        say(f"ledger: {t}; exit 3 until then", "bold red")
    status_table(report).print(console, wide)

    busy = {u.unit for u in report.units if u.label == IN_PROGRESS}
    say(f"units ({report.counts['total']}): {counts_line(report.counts, len(busy))}")
    if report.speed["units_timed"]:
        say(speed_line(report.speed))
    if line := speedups_line(report.units):
        say(line)
    say(prefill_line((report.prefill["state"], report.prefill["commit"], report.prefill["reason"])),
        "bold green" if report.prefill["state"] == "verified" else None)
    if report.throughput is not None:
        for line in throughput_lines(report.throughput):
            say(line, "bold red" if "SLOW" in line else None)
    cp = report.critical_path
    if cp["available"]:
        say(f"critical path ({'+'.join(cp['tiers'])}, {cp['counts']['total']} units): "
            f"{counts_line(cp['counts'], len(busy & set(cp['units'])))}")
    else:
        say(f"critical path: {cp['reason']}")
    led = report.ledger
    if led["ok"]:
        new = " (a new workspace: witnessed from its first record on)" if not led["records"] else ""
        for line in phrase_lines(f"ledger: {led['records']} records{new}, chain ok, {led['key']}", console.width):
            say(line)
    else:
        more = f" (+{len(led['problems']) - 1} more)" if len(led["problems"]) > 1 else ""
        word = "ROLLED BACK" if led.get("rolled_back") else "TAMPERED"
        say(f"ledger: {led['records']} records, {word}: {led['problems'][0]}{more}", "bold red")
    for p in report.problems:
        say(f"tampered: {p}", "bold red")
    for n in report.notes:
        say(f"note: {n}", "dim")


def phrase_lines(text: str, width: int, indent: str = "  ") -> list[str]:
    """`text` in lines of at most `width` columns, broken after its commas (a line of phrases such as the
    ledger's, which a terminal would break in the middle of a key's fingerprint); a phrase longer than a
    line is left whole on its own line."""
    import re

    lines: list[str] = []
    for phrase in re.split(r"(?<=,) ", text):
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        else:
            lines.append((indent if lines else "") + phrase)
    return lines


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (stable schema)")
    from porter.term import add_wide_argument

    add_wide_argument(parser)
    parser.add_argument("--reverify", action="store_true", help="also run static, build and (with a GPU) parity on the current files now; exit 1 if that contradicts a recorded built/verified")


def run(args) -> int:
    workspace = Path(getattr(args, "workspace", None) or Path.cwd())
    report = derive(workspace, getattr(args, "target", None), getattr(args, "source", None))
    fresh = contradicted_units = None
    if getattr(args, "reverify", False):
        print(REVERIFY_SAYS, file=sys.stderr if getattr(args, "json", False) else sys.stdout)
        from porter.term import console, steps_factory

        target = load_target(workspace, report.target, getattr(args, "source", None))
        # a bar on a terminal (stderr beside --json); nothing more in a log: the section says it all
        fresh = reverify(target, progress=steps_factory(console(file=sys.stderr if getattr(args, "json", False)
                                                                else None)))
        contradicted_units = contradicted({u.unit: u.state for u in report.units}, fresh)
    if getattr(args, "json", False):
        out = report.to_json()
        if fresh is not None:
            out["reverify"] = {"units": [r.to_json() for r in fresh], "contradicted": contradicted_units}
        sys.stdout.write(json.dumps(out, indent=2, sort_keys=False) + "\n")
    else:
        from porter.term import console as make_console

        wide = getattr(args, "wide", False)
        con = make_console(wide)
        render(report, con, wide=wide)
        if fresh is not None:
            con.print()
            reverify_table(fresh).print(con, wide)
            if contradicted_units:
                con.print(f"recorded state contradicted now: {', '.join(contradicted_units)}", markup=False,
                          highlight=False)
    if report.exit_code == 0 and contradicted_units:
        return 1
    return report.exit_code
