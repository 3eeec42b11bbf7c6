"""Gates on every required GPU architecture, and the per-architecture verdicts their evidence holds.

    across(required, served, run_one, gate) -> GateResult   one run per required kind, one gate result
    verdicts(evidence) -> {arch: True | False}         what a parity evidence record says per kind

A unit verified on sm_90 can fail on sm_121 (warp-size assumptions, shared-memory limits, tensor-core
paths chosen by device attributes), so where a target or a run requires several kinds
(porter.host.arch.required) parity runs once on a GPU of each.  The gate's result is one (the driver and the
ledger keep one result per gate): its evidence is the first refusing run's (else the first passing
one's), with `archs` holding every kind's own verdict and evidence, and the kinds no reachable GPU
has as not measured.  Such a result can pass (the measured kinds passed), but status shows the unit
verified only where every required kind has a passing verdict: "built (sm_121 not measured)".
"""

from __future__ import annotations

from typing import Callable

from porter.host import arch as gpu_arch
from porter.gates.evidence import Evidence
from porter.gates.result import GateResult


def arch_of(evidence: dict | None) -> str | None:
    """The GPU architecture a parity evidence record's child ran on ("sm_90"), None for the host stand-in."""
    return Evidence.of(evidence).arch


def across(required: tuple[str, ...], served: tuple[str, ...], run_one: Callable[[str], GateResult],
           gate: str) -> GateResult:
    """`gate` (parity; perf judges each kind's timing alike) on a GPU of each `required` architecture
    that `served` (the executor's GPU kinds) holds."""
    runs: dict[str, GateResult] = {}
    for arch in required:
        if arch not in served:
            continue
        res = run_one(arch)
        seen = arch_of(res.evidence)
        if seen is not None and seen != arch:
            # the worker was placed as `arch` but its child saw another GPU: no verdict on either kind
            res = GateResult(gate, False, f"{gate} skipped: placed on {arch} but the run saw {seen}",
                             skipped=True, evidence=dict(res.evidence or {}, ok=False))
        runs[arch] = res
    unmeasured = [a for a in required if a not in runs]
    nowhere = (f"no GPU of {', '.join(unmeasured)} reachable (GPUs here: {', '.join(served) or 'none'})"
               if unmeasured else "")
    if not runs:
        return GateResult(gate, False, f"{gate} skipped: {nowhere}", skipped=True,
                          evidence={"gate": gate, "ok": False,
                                    "archs": {a: {"measured": False, "why": nowhere} for a in unmeasured}})
    refused = [a for a, r in runs.items() if not r.ok and not r.skipped]
    passed = [a for a, r in runs.items() if r.ok]
    skipped = [a for a, r in runs.items() if r.skipped]
    first = runs[(refused or passed or skipped)[0]]
    # a kind whose run could not judge (a harness fault, a GPU of another kind) is as unmeasured as one
    # no GPU serves.  A refusal on any kind decides; else the result passes only where every required
    # kind passed: one unmeasured leaves it skipped, so the run commits the unit `built`, never
    # `verified` (its own summary included), and a later run with that GPU judges it again
    missing = bool(unmeasured or skipped)
    ok = not refused and bool(passed) and not missing
    per_arch = {a: {"measured": not r.skipped, "ok": r.ok and not r.skipped, "summary": r.summary,
                    "evidence": r.evidence} for a, r in runs.items()}
    per_arch.update({a: {"measured": False, "why": nowhere} for a in unmeasured})
    evidence = dict(first.evidence or {}, ok=ok, archs=per_arch)
    summary = f"[{(refused or passed or skipped)[0]}] {first.summary}"
    if refused and len(runs) > 1:
        summary += f" (failing on {', '.join(refused)}; passed on {', '.join(passed) or 'none'})"
    if unmeasured:
        summary += f"; {', '.join(unmeasured)} not measured: {nowhere}"
    for a in skipped if (passed or refused) else ():
        summary += f"; {a} not measured: {runs[a].summary}"
    if not refused and missing:
        summary = f"{gate} skipped: not measured on every required architecture; {summary}"
    return GateResult(gate, ok, summary[:600], first.diagnostics, first.metrics, evidence,
                      skipped=not refused and missing or not passed and not refused, check=first.check)


def measured(evidence: dict | None) -> dict[str, dict]:
    """{arch: that kind's own evidence} for every kind a combined record holds a passing run of."""
    per_arch = Evidence.of(evidence).archs or {}
    return {a: v.evidence for a, v in per_arch.items() if v.ok is True and v.evidence is not None}


def verdicts(evidence: dict | None) -> dict[str, bool]:
    """{arch: passed} of one parity (or perf) evidence record: its per-architecture runs where it has them, else
    the one architecture its child saw (none for the host stand-in).  A kind not measured is absent."""
    ev = Evidence.of(evidence if isinstance(evidence, (dict, Evidence)) else None)
    if ev.archs is not None:
        got = {a: v.ok is True for a, v in ev.archs.items() if v.measured}
        return dict(sorted(got.items(), key=lambda kv: gpu_arch.order(kv[0])))
    return {ev.arch: ev.ok is True} if ev.arch else {}
