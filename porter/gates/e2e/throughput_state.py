"""What status may say about the engine's tokens/s, and when porter run owes a throughput run.

Like prefill (porter.gates.e2e.state), a function of evidence and hashes only: a throughput record
counts through its intact evidence and the backend tree hash it ran on, and a record of another tree
is shown as stale, never as the speed of HEAD.
"""

from __future__ import annotations

from pathlib import Path

from porter.gates.e2e.accuracy import accuracy_line
from porter.gates.e2e.state import E2E_UNIT, backend_records, head_backend_tree
from porter.gates.e2e.throughput_gate import GATE
from porter.gates.evidence import ThroughputEvidence


def throughput_records_from_ledger(workspace: Path, target: str, records: list) -> list[ThroughputEvidence]:
    """Every throughput record of `target` whose evidence is intact and fits, in ledger order."""
    return [typed for _, typed in backend_records(workspace, target, records, GATE, ThroughputEvidence)
            if typed.unit == E2E_UNIT]


def throughput_due(records: list[ThroughputEvidence], head_tree_hash: str | None, prefill_verified_here: bool
                   ) -> tuple[bool, str]:
    """(due, why): owed once e2e passed on HEAD's backend tree and no throughput record (pass, fail or
    skip) exists for that tree; a changed unit makes a new tree, so the verdict follows the code."""
    if not prefill_verified_here:
        return False, "e2e has not passed on this backend tree"
    if head_tree_hash is None:
        return False, "no HEAD commit"
    if any(r.tree_hash == head_tree_hash for r in records):
        return False, "throughput already ran on this backend tree"
    return True, "e2e passed on this backend tree and its throughput was never measured"


def throughput_state(records: list[ThroughputEvidence], head_tree_hash: str | None) -> dict:
    """{state, ok, phases: {phase: {tps, ratio, ok, p_value, margin}}, commit, reason, accuracy} of the newest
    judged record: 'measured' on HEAD's tree, 'stale' on another, 'unmeasured' when none was judged.
    `accuracy` is that record's (porter.gates.e2e.accuracy; None where it has none)."""
    judged = [r for r in records if r.verdict is not None and r.verdict.phases and all(_figures(p) for p in
                                                                                      r.verdict.phases)]
    if not judged:
        newest = records[-1] if records else None
        why = (newest.summary if newest is not None and getattr(newest, "summary", None) else "no throughput record")
        return {"state": "unmeasured", "ok": None, "phases": {}, "commit": None, "reason": str(why)[:300],
                "accuracy": None}
    here = [r for r in judged if r.tree_hash == head_tree_hash]
    rec = (here or judged)[-1]
    phases = {p.phase: {"tps": p.candidate_tps, "upstream_tps": p.upstream_tps, "ratio": p.ratio, "ok": p.ok,
                        "p_value": p.p_value, "margin": p.margin} for p in rec.verdict.phases}
    return {"state": "measured" if here else "stale", "ok": rec.ok, "phases": phases, "commit": rec.commit,
            "reason": rec.verdict.reason or "", "accuracy": rec.accuracy.dump() if rec.accuracy else None}


def _figures(phase) -> bool:
    """The phase holds every figure the gate writes: a record without them (hand-made, or cut) measured
    nothing status could show, and is read as no measurement rather than crash a status line."""
    return all(getattr(phase, k) is not None for k in ("phase", "ok", "candidate_tps", "upstream_tps", "ratio",
                                                      "margin", "p_value"))


def throughput_lines(state: dict) -> list[str]:
    """'prefill: 1234 t/s (0.98x upstream, fast)' per phase, or one line saying why there is none; then the
    record's accuracy line, where it has one."""
    if state["state"] == "unmeasured":
        return [f"throughput: unmeasured ({state['reason']})"]
    where = f"at {(state['commit'] or '?')[:12]}" if state["state"] == "measured" else \
        f"stale: measured at {(state['commit'] or '?')[:12]}, the backend changed since"
    out = []
    for phase, p in state["phases"].items():
        word = "fast" if p["ok"] else "SLOW"
        out.append(f"{phase}: {p['tps']:.1f} t/s ({p['ratio']:.2f}x upstream, {word}; A/A margin {p['margin']:.1%}, "
                   f"p={p['p_value']:.3f}) {where}")
    acc = accuracy_line(state.get("accuracy"))
    if acc:
        out.append(acc.replace("accuracy:", f"accuracy ({where}):", 1))
    return out


def throughput_status(workspace: Path, target, records: list) -> dict:
    return throughput_state(throughput_records_from_ledger(Path(workspace), target.name, records),
                            head_backend_tree(workspace, target))
