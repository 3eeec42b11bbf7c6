"""What status may say about prefill, and when porter run owes an e2e run.

Both are functions of e2e evidence and hashes; nothing here reads a stored
verdict such as "prefill works".  An e2e record counts only through its evidence
(ok and the backend tree hash it ran on), and only when that evidence is intact
in ledger/evidence/.  status calls prefill_status, porter run run_e2e_if_due.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from porter.gates.e2e import tree
from porter.gates.evidence import E2EEvidence, EvidenceError
from porter.gates.result import GateResult

VERIFIED, STALE, UNVERIFIED = "verified", "stale", "unverified"
E2E_UNIT = "e2e:prefill"  # e2e evidence is about the backend as a whole, not one unit


def prefill_state(e2e_records: list[dict], head_tree_hash: str | None) -> tuple[str, str | None, str]:
    """(state, commit, reason) from e2e evidence records, oldest first.

    'verified' (with the commit it ran at) only when a passing record's backend
    tree hash equals HEAD's; 'stale' when the newest passing record ran on
    another tree; 'unverified' when nothing ever passed (or HEAD has no
    backend tree to compare).
    """
    records = [E2EEvidence.of(r) for r in e2e_records]
    passing = [r for r in records if r.ok is True and r.gate == "e2e" and r.tree_hash]
    if head_tree_hash is None:
        return UNVERIFIED, None, "no HEAD commit: no backend tree to verify"
    for rec in reversed(passing):
        if rec.tree_hash == head_tree_hash:
            if rec.tree_matches_head is False:
                # porter optimize runs e2e on the tree its step will make, before that commit exists: the
                # record's commit is the one the step landed on, not one where this tree was measured
                return VERIFIED, None, (f"e2e passed on this backend tree, run before it was committed (on top "
                                        f"of {_short(rec.commit)})")
            return VERIFIED, rec.commit, f"e2e passed on this backend tree ({_short(rec.commit)})"
    if passing:
        newest = passing[-1]
        return STALE, newest.commit, (f"e2e last passed at {_short(newest.commit)}; the backend "
                                      f"sources changed since")
    failed = [r for r in records if r.gate == "e2e" and r.ok is False]
    if failed and failed[-1].tree_hash == head_tree_hash:
        return UNVERIFIED, None, f"e2e failed on this backend tree: {failed[-1].summary or ''}"[:300]
    return UNVERIFIED, None, "no passing e2e record"


def prefill_line(state: tuple[str, str | None, str]) -> str:
    """The status line: 'prefill: verified at <commit>', 'prefill: stale (...)', 'prefill: unverified (...)'."""
    s, commit, reason = state
    if s == VERIFIED:
        return f"prefill: verified at {_short(commit)}" if commit else f"prefill: verified ({reason})"
    return f"prefill: {s} ({reason})"


def e2e_records_from_ledger(workspace: Path, target: str, records: list) -> list[dict]:
    """The evidence of every e2e gate record of `target` among porter.records.history's typed records, in ledger
    order; records whose evidence is missing, edited, swapped or not what porter writes are left out (they
    cannot count)."""
    return [ev for ev, _ in backend_records(workspace, target, records, "e2e", E2EEvidence)]


def backend_records(workspace: Path, target: str, records: list, gate: str, model) -> list[tuple[dict, object]]:
    """(evidence, as `model`) of every `gate` record of `target` whose evidence is intact, fits the model
    and agrees with its ledger line (gate, target, ok), in ledger order: what a backend gate's state reads."""
    from porter.records.evidence import check_evidence
    from porter.records.history import GateRecord

    out = []
    for rec in records:
        if not isinstance(rec, GateRecord) or rec.gate != gate or rec.target != target:
            continue
        ev, problem = check_evidence(workspace, str(rec.evidence))
        if problem is not None:
            continue
        try:
            typed = model.of(ev)
        except EvidenceError:
            continue
        if typed.gate == gate and typed.target == target and typed.ok == rec.ok:
            out.append((ev, typed))
    return out


def e2e_due(unit_states: dict[str, str], prefill_units: list[str], e2e_records: list[dict],
            head_tree_hash: str | None) -> tuple[bool, str]:
    """(due, why): porter run owes an e2e run when every prefill-tier unit is verified and no e2e
    record (pass or fail) exists for the current backend tree; a unit change makes a new tree."""
    if not prefill_units:
        return False, "the target has no prefill-tier units"
    waiting = [u for u in prefill_units if unit_states.get(u) != VERIFIED]
    if waiting:
        return False, f"{len(waiting)} prefill-tier unit(s) not verified (first: {waiting[0]})"
    if head_tree_hash is None:
        return False, "no HEAD commit"
    if any(r.tree_hash == head_tree_hash for r in map(E2EEvidence.of, e2e_records) if r.gate == "e2e"):
        return False, "e2e already ran on this backend tree"
    return True, "every prefill-tier unit is verified and this backend tree has no e2e record"


def head_backend_tree(workspace: Path, target) -> str | None:
    return tree.tree_hash_at(Path(workspace), tree.backend_dirs(target))


def prefill_status(workspace: Path, target, records: list) -> tuple[str, str | None, str]:
    """prefill_state of `target` from porter.records.history's typed records."""
    return prefill_state(e2e_records_from_ledger(Path(workspace), target.name, records),
                         head_backend_tree(workspace, target))


def run_e2e_if_due(target, workspace: Path, unit_states: dict[str, str], prefill_units: list[str], records: list, *,
                   run: Callable[[], GateResult], record: Callable[[GateResult], object]) -> GateResult | None:
    """Run the e2e gate (`run`: porter run builds the backend and calls the gate through the driver)
    when e2e_due says so, and hand the result to `record`; None when not due.  `unit_states`: unit ->
    status word, `prefill_units`: the units ranked on the prefill tier (porter.target.plan)."""
    records = e2e_records_from_ledger(Path(workspace), target.name, records)
    if not e2e_due(unit_states, prefill_units, records, head_backend_tree(workspace, target))[0]:
        return None
    res = run()
    record(res)
    return res


def _short(commit: str | None) -> str:
    return (commit or "?")[:12]
