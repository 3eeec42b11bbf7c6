"""Speedup gate (`porter optimize`): is the candidate faster than the committed unit, with proof?

It runs after parity and perf passed the candidate, and judges one thing: old against new on the
same GPU, in interleaved rounds (ABBA: A B B A A B ..., so a drift of clocks or temperature over the
comparison falls on both sides alike).  Each round is one parity run of the spec's timed cases
(run_spec: a fresh sandboxed process, fresh seeds, outputs checked, timed calls re-checked); its
observation is the median of its timed calls.  The verdict is decide.decide on the rounds' medians:
a win needs the rank test at ALPHA and a gain above the committed kernel's A/A margin.

The committed side is the unit file at HEAD, built by the build gate in a context of its own (the
object cache makes the rest of the backend free).  A round that fails parity refuses the candidate
(check "parity": fast because wrong, or wrong only sometimes); a round of the committed side that
fails is the harness's or the spec's problem, never the candidate's, and the gate is skipped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from porter.records import gitops
from porter.records.evidence import gate_facts
from porter.gates.evidence import ParityEvidence, SpeedupEvidence
from porter.spec import SpecError, UnitSpec, load_spec
from porter.gates.result import GateResult
from porter.optimize.decide import ALPHA, MIN_GAIN, ROUNDS, decide

GATE = "speedup"
REPS = 10  # timed calls per round; the round's median is its one observation


def abba(rounds: int) -> list[str]:
    """The order of 2*rounds runs: A B B A A B B A ... ('old' is A)."""
    return [("old", "new")[((k + 1) // 2) % 2] for k in range(2 * rounds)]


def time_round(target, spec, library: Path, ctx, candidate_sha256: str) -> GateResult:
    """One round: the spec's timed cases against `library` in a fresh sandboxed process.  Module-level
    so CPU tests can put synthetic timings in its place."""
    from porter.gates.parity.gate import run_spec

    return run_spec(target, spec, library, workspace=ctx.workspace, timing_reps=REPS, mode=ctx.parity.mode,
                    timeout=ctx.parity.timeout, env=ctx.parity.env, regime=ctx.parity.regime, fresh_process=True,
                    candidate_sha256=candidate_sha256)


def committed_library(candidate, ctx) -> tuple[object, Path | None, str]:
    """(the committed unit as a Candidate, its backend library, why not).  Built with the build gate in a
    context of its own: the candidate's library in ctx stays the candidate's."""
    from porter.gates import build
    from porter.gates.driver import Candidate, GateContext

    rel = str(ctx.target.unit_path(candidate.unit).relative_to(ctx.workspace))
    blob = gitops.committed_blob(ctx.workspace, rel)
    if blob is None:
        return None, None, f"{rel} is not committed: nothing to compare with"
    old = Candidate.of(candidate.unit, blob.decode())
    mine = GateContext(ctx.target, ctx.workspace, build_cache=ctx.build_cache, parity=ctx.parity)
    res = build.run(old, mine)
    if not res.ok:
        return old, None, f"the committed {rel} does not build here: {res.summary}"
    return old, mine.library, ""


def run(candidate, ctx) -> GateResult:
    target, unit = ctx.target, candidate.unit
    ran = ParityEvidence.of(ctx.results["parity"].evidence) if ctx.results.get("parity") else None
    facts = gate_facts(target, unit, GATE, candidate.sha256, ran.toolchain.dump() if ran and ran.toolchain else {},
                       alpha=ALPHA, min_gain=MIN_GAIN, rounds=ROUNDS, reps=REPS)

    def record() -> dict:  # the facts so far, as the speedup gate's evidence
        return SpeedupEvidence.record(facts)

    def skipped(why: str) -> GateResult:
        return GateResult(GATE, False, f"speedup skipped: {why}", skipped=True, evidence=record())

    try:
        spec = load_spec(target, unit)
    except SpecError as exc:
        return skipped(f"spec error: {exc}")
    timed = [s for s in getattr(spec, "shapes", []) if s.timed] if isinstance(spec, UnitSpec) else []
    if not timed:
        return skipped(f"{unit} has no timed parity case to compare on")
    timed_spec = dataclasses.replace(spec, shapes=timed)
    old, old_lib, why = committed_library(candidate, ctx)
    if old_lib is None:
        return skipped(why)
    facts["committed_sha256"] = old.sha256
    sides = {"old": (old_lib, old.sha256), "new": (Path(ctx.library), candidate.sha256)}
    medians: dict[str, list[float]] = {"old": [], "new": []}
    roofline: dict[str, float | None] = {"old": None, "new": None}
    order = abba(ROUNDS)
    facts["order"] = order
    for k, side in enumerate(order):
        lib, sha = sides[side]
        res = time_round(target, timed_spec, lib, ctx, sha)
        timing = ParityEvidence.of(res.evidence).timing
        if side == "new" and not res.ok and not res.skipped:
            facts.update(medians_ms=medians, failed_round=k)
            return GateResult(GATE, False, f"speedup refused: round {k + 1} of the candidate failed parity: "
                              f"{res.summary}", check="parity", diagnostics=res.diagnostics, evidence=record())
        if not res.ok or timing is None or not timing.median_ms:
            facts.update(medians_ms=medians, failed_round=k)
            return skipped(f"round {k + 1} ({side}) gave no timing: {res.summary}")
        medians[side].append(float(timing.median_ms))
        roofline[side] = timing.roofline_ms or roofline[side]
    d = decide(medians["old"], medians["new"])
    fractions = {s: (roofline[s] / m if roofline[s] else None)
                 for s, m in (("old", d.old_median_ms), ("new", d.new_median_ms))}
    facts.update(medians_ms=medians, decision=d.as_dict(), roofline_fraction=fractions, case=timed[-1].label)
    ratio = d.old_median_ms / d.new_median_ms
    metrics = {"speedup": ratio, "p_value": d.p_value, "gain": d.gain, "aa_margin": d.aa_margin,
               "old_median_ms": d.old_median_ms, "new_median_ms": d.new_median_ms}
    if d.wins:
        return GateResult(GATE, True, f"speedup: {ratio:.2f}x faster ({d.old_median_ms:.4g} -> {d.new_median_ms:.4g} ms, "
                          f"p={d.p_value:.2g}, A/A margin {d.aa_margin:.1%})", metrics=metrics, evidence=record())
    line = (f"speedup {d.verdict}: {d.why} (committed {d.old_median_ms:.4g} ms, candidate {d.new_median_ms:.4g} ms "
            f"over {ROUNDS} rounds each)")
    return GateResult(GATE, False, line, check=d.verdict, metrics=metrics, evidence=record(), diagnostics=(
        "The candidate is correct but not measurably faster than the committed code: "
        + d.why + ". Only a speedup the rank test and the A/A margin both confirm is kept."))
