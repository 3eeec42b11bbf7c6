"""Everything the report shows, gathered once from the workspace and nothing else.

The past is read only through porter.commands.status.derive (states, ledger integrity),
porter.commands.audit (one unit's attempts, sources and landing commit) and
porter.records.history (runs, calibrations): the report never re-walks ledger records
itself, so it cannot disagree with `porter status` or `porter audit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from porter.commands.audit import audit
from porter.gates import mutants
from porter.errors import PorterError
from porter.records.evidence import check_evidence
from porter.gates.evidence import problem as malformed
from porter.gates import registry
from porter.gates.e2e.throughput_state import throughput_lines
from porter.records.history import Attempt, Failure, History, Step
from porter.records.ledger import load_key
from porter.target.plan import TIERS, ranked_units
from porter.commands.status import STATES, StatusReport, _resolve_target_name, derive
from porter.target import Target, load_target

# Until the end-to-end gate lands in derive(), its slot reads as this.
NO_PREFILL = {"state": "none", "text": "no end-to-end evidence"}


@dataclass
class UnitPage:
    unit: str
    state: str
    reason: str
    tier: str | None
    rank: int | None
    kernels: list[str]
    path: list[str]  # call chain from the entry point
    phases: list[str]  # "prefill", "decode": the entry points that reach it
    audit: dict
    evidence: list[dict]  # the latest step's evidence, loaded and hash-checked
    calibration: dict | None
    label: str = ""  # status's label: "failing (sm_121)", "built (sm_121 not measured)"
    archs: dict = field(default_factory=dict)  # status's per-architecture verdicts

    @property
    def page(self) -> str:
        return unit_page_name(self.unit)


@dataclass
class RunSummary:
    run: str
    start: str
    end: str
    units: list[str]
    attempts: int
    failures: int
    steps: dict[str, int]  # state -> count


@dataclass
class SiteData:
    target: str
    workspace: Path
    status: StatusReport
    units: list[UnitPage]
    tiers: dict[str, dict[str, int]]  # tier -> state -> count
    critical: dict
    prefill: dict
    ledger: dict
    calibration: list[dict]
    runs: list[RunSummary]
    entries: dict[str, list[str]]
    refused: dict[str, int] = field(default_factory=dict)  # gate -> answers it refused, over every unit
    notes: list[str] = field(default_factory=list)
    throughput: list[str] = field(default_factory=list)  # status's tokens/s lines, one per phase


def prefill_slot(value) -> dict:
    """derive()'s end-to-end verdict as {"state", "text"}: the e2e gate is being wired into status
    (verified at <commit> / stale / unverified); until it is, the slot reads "no end-to-end evidence".
    Accepts a word, or a dict with "state" and optionally "text"/"reason"/"commit"."""
    if not value:
        return dict(NO_PREFILL)
    if isinstance(value, str):
        return {"state": value.split()[0].rstrip(":,;"), "text": value}
    if isinstance(value, dict):
        state = str(value.get("state") or "unverified")
        text = value.get("text") or " ".join(str(x) for x in (state, value.get("commit") and f"at {value['commit'][:12]}",
                                                             value.get("reason") and f"({value['reason']})") if x)
        return {"state": state, "text": text}
    return {"state": "unverified", "text": f"unreadable prefill verdict: {value!r}"[:200]}


def unit_page_name(unit: str) -> str:
    return f"units/{unit}.html"


def _evidence(workspace: Path, shas: list[str]) -> list[dict]:
    out = []
    for sha in shas:
        ev, problem = check_evidence(workspace, sha)
        if problem is None and (bad := malformed(ev)):  # intact, but not what porter writes
            problem = f"evidence {sha[:12]} is not what porter writes: {bad}"
        out.append({"sha256": sha, "problem": problem, "data": ev or {}})
    return out


def _calibration(target: Target, history: History) -> tuple[dict[str, dict], list[str]]:
    """Per unit with a parity spec: whether that exact spec (by its identity, the sha256 over the
    spec file, its helpers, references and verdict code: porter.spec.identity) is
    calibrated. Read as data (the files' bytes, their syntax trees and the calibration records),
    never imported: a reviewer's report runs no code of the workspace. A unit is matched to its
    spec by the identity a calibration record names, else by the file named after it."""
    from porter.spec import identity
    from porter.spec import spec_dir

    files, notes = {}, []
    for path in sorted(spec_dir(target).glob("*.py")) if spec_dir(target).is_dir() else []:
        if not path.name.startswith("_") and path.is_file() and not path.is_symlink():
            try:
                files[identity.digest(identity.components(path))] = path
            except (identity.IdentityError, OSError) as exc:
                notes.append(f"{path.name}: no identity ({exc})")
    units = set(target.units)
    by_name = {p.stem: sha for sha, p in files.items() if p.stem in units}
    try:
        every = mutants.load_mutants(target)
    except (PorterError, OSError, ValueError) as exc:
        every = []  # every calibration that ran a mutant then reads changed, and the note says why
        notes.append(f"mutants: {exc}")
    out = {}
    for unit in sorted(set(by_name) | {r.unit for r in history.mine if r.kind == "calibration" and isinstance(r.unit, str)}):
        hashed = [r.spec_sha256 for r in history.calibrations(unit) if r.spec_sha256 in files]
        sha = hashed[-1] if hashed else by_name.get(unit)
        if sha is None:
            continue  # calibrated once, its spec file gone
        st = history.calibration_status(unit, sha, mutants.current_digests(target, unit, every))
        out[unit] = dict(st, unit=unit, spec=files[sha].name, spec_sha256=sha)
    return out, notes


def _runs(history: History) -> list[RunSummary]:
    """One line per run. Attempt records carry the run id; gate, failure and step records may not,
    so they join the run of their own (unit, attempt)."""
    runs: dict[str, RunSummary] = {}
    run_of: dict[tuple, str] = {}
    for r in history.mine:
        run = r.run if isinstance(r.run, str) and r.run else run_of.get((r.unit, r.attempt))
        if run is None:
            continue
        if isinstance(r, Attempt):
            run_of[(r.unit, r.attempt)] = run
        s = runs.get(run)
        if s is None:
            s = runs[run] = RunSummary(run, r.time, r.time, [], 0, 0, {})
        s.end = max(s.end, r.time or "")
        s.start = min(s.start, r.time or s.start)
        if isinstance(r.unit, str) and r.unit not in s.units:
            s.units.append(r.unit)
        if isinstance(r, Attempt):
            s.attempts += 1
        elif isinstance(r, Failure):
            s.failures += 1
        elif isinstance(r, Step) and isinstance(r.state, str):
            s.steps[r.state] = s.steps.get(r.state, 0) + 1
    return sorted(runs.values(), key=lambda s: s.start)


def collect(workspace: Path, target_name: str | None = None, source=None) -> SiteData:
    workspace = Path(workspace).resolve()
    target = load_target(workspace, _resolve_target_name(workspace, target_name), source)
    key = load_key(workspace)
    status = derive(workspace, target=target, key=key)
    history = History.read(workspace, target.name, key)
    notes: list[str] = []
    try:
        ranked = {r.unit: r for r in ranked_units(target)}
    except Exception as exc:  # same rule as status: a partial scan still gives a report
        ranked = {}
        notes.append(f"ranking unavailable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
    calibration, cal_notes = _calibration(target, history)
    notes += cal_notes

    pages = []
    for st in status.units:
        data = audit(workspace, target.name, st.unit, source, key=key, report=status)
        host = data["metal"]["host"]
        if host.get("path") and Path(host["path"]).is_relative_to(workspace):  # the page names workspace paths as git does
            host["path"] = Path(host["path"]).relative_to(workspace).as_posix()
        r = ranked.get(st.unit)
        pages.append(UnitPage(
            unit=st.unit, state=st.state, reason=st.reason, tier=st.tier, rank=r.rank if r else None,
            kernels=list(r.kernels) if r else [], path=list(r.path) if r else [], phases=list(r.phases) if r else [],
            audit=data,
            evidence=_evidence(workspace, st.evidence), calibration=calibration.get(st.unit),
            label=st.label, archs=st.archs,
        ))

    refused: dict[str, int] = {}
    for p in pages:
        for a in p.audit["attempts"]:
            for f in a["failures"]:
                refused[f["gate"]] = refused.get(f["gate"], 0) + 1

    order = registry.names()  # the gates' own order, cheapest first
    refused = dict(sorted(refused.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), str(kv[0]))))

    tiers = {t: {s: 0 for s in STATES} for t in (*TIERS, "unranked")}
    for p in pages:
        tiers[p.tier or "unranked"][p.state] += 1
    tiers = {t: c for t, c in tiers.items() if any(c.values())}

    data = status.to_json()
    prefill = prefill_slot(data.get("prefill"))
    entries = {}
    try:
        from porter.target.scan import scan

        eng = scan(target).engine
        entries = dict(eng.entries) if eng else {}
    except Exception:  # noqa: BLE001  the graph then starts at the units
        pass
    return SiteData(target=target.name, workspace=workspace, status=status, units=pages, tiers=tiers,
                    critical=status.critical_path, prefill=prefill, ledger=status.ledger,
                    calibration=[calibration[u] for u in sorted(calibration)], runs=_runs(history),
                    entries=entries, refused=refused, notes=notes + list(status.notes),
                    throughput=throughput_lines(status.throughput) if status.throughput else [])
