"""Perf gate: a candidate that passed parity must not be far slower than the known-good code.

The failed ds4 port shipped one-thread-per-output kernels that compute the
right numbers; parity cannot see that.  The baseline is the known-good
implementation's kernel time on the same spec case, recorded by
`porter calibrate` (its evidence holds the CUDA-event timing).  The candidate's
time comes from its own parity run.  Both are medians of CUDA-event timings of
the largest timed case of the spec; the gate fails when the candidate is more
than `max_slowdown` times slower.  The slack is wide on purpose: the baseline
may come from another run or another GPU of the same family, while the
failures this gate exists for are hundreds of times slower.

No calibrated baseline (or a spec changed since calibration): the gate decides
against an absolute floor instead, from the op's roofline at the spec's timed
sizes: the bytes the op must move over the device's peak bandwidth, or its
FLOPs over the device's FP32 peak where the spec declares them, whichever is
longer.  The candidate must reach the spec's `perf_floor` fraction of that
roofline (DEFAULT_FLOOR_FRACTION when it declares none), plus LAUNCH_ALLOWANCE_MS
for the launches themselves: at minimoe's sizes the roofline is far below one
launch, and only a grossly serial kernel fails there; at ds4's sizes the floor
bites.  A result more than FLAG_FASTER times faster than the known-good is
passed but flagged in the evidence (parity's "impossible" check refuses what
beats the bandwidth outright).  The gate is skipped only when it is off, or
when parity recorded no timing or no roofline (no GPU peak known): status then
says "verified (perf unmeasured)", never plain "verified".
"""

from __future__ import annotations

from porter.evidence import gate_facts, load_evidence
from porter.gates.result import GateResult

DEFAULT_MAX_SLOWDOWN = 8.0
DEFAULT_FLOOR_FRACTION = 0.05  # of the roofline, at the spec's largest timed case
LAUNCH_ALLOWANCE_MS = 0.02  # a few kernel launches and their tails, which no roofline counts
FLAG_FASTER = 10.0  # known-good / candidate above this: flagged for review (KernelBench's rule)


def perf_settings(target) -> tuple[bool, float]:
    perf = target.spec.perf
    return perf.enabled, perf.max_slowdown or DEFAULT_MAX_SLOWDOWN


def baseline(history, unit: str, spec_sha256: str | None) -> tuple[dict | None, str]:
    """The latest ok calibration's known-good timing for this exact spec, or (None, why not)."""
    recs = history.calibrations(unit)
    if not recs:
        return None, "no calibration of this unit's spec (run `porter calibrate`)"
    # a calibration, or a known-good baseline a run took (calibration/baseline.py): either way the
    # known-good passed this exact spec, and its timing is evidence
    current = [r for r in recs if (r.ok or r.known_good_ok) and r.spec_sha256 == spec_sha256 and r.evidence]
    if not current:
        return None, "the spec changed or failed since its last calibration"
    rec = current[-1]
    ev = load_evidence(history.workspace, rec.evidence) or {}
    timing = ev.get("timing")
    if not timing or not timing.get("median_ms"):
        return None, "the calibration evidence has no timing"
    return dict(timing, calibration_record=rec.hash, known_good=rec.known_good,
                gpu=(ev.get("device") or {}).get("name")), ""


def run(candidate, ctx) -> GateResult:
    target, unit, parity = ctx.target, candidate.unit, ctx.results["parity"]
    enabled, max_slowdown = perf_settings(target)
    cand_sha = parity.evidence.get("candidate_sha256")
    facts = gate_facts(target, unit, "perf", cand_sha, parity.evidence.get("toolchain", {}), max_slowdown=max_slowdown)
    if not enabled:
        return GateResult("perf", False, "perf gate off ([perf] enabled = false)", skipped=True, evidence=facts)
    mine = parity.evidence.get("timing")
    if not mine or not mine.get("median_ms"):
        return GateResult("perf", False, "perf skipped: the parity run recorded no timing", skipped=True,
                          evidence=facts)
    spec_sha = (parity.evidence.get("spec") or {}).get("sha256")
    base, why = baseline(ctx.history, unit, spec_sha)
    if base is not None and base.get("case") != mine.get("case"):
        base, why = None, f"baseline timed {base.get('case')!r}, candidate {mine.get('case')!r}"
    if base is None and not target.spec.perf.roofline_floor:
        # measured on an H100: upstream ds4's own matmul, top-k and MoE kernels fell under a floor computed
        # from HBM bandwidth, because the backend reads its weights over the host link in place; only a
        # calibrated known-good can judge such a backend
        regime = target.spec.perf.regime or "[perf] roofline_floor = false"
        return GateResult("perf", False, f"perf skipped: {why}; the roofline floor assumes device-resident "
                          f"bytes, and {target.name} has no such floor ({regime})", skipped=True,
                          evidence=dict(facts, candidate=mine))
    if base is None:
        return against_floor(mine, facts, why)
    ratio = mine["median_ms"] / base["median_ms"]
    line = (f"{mine['median_ms']:.4g} ms vs known-good {base['median_ms']:.4g} ms on {mine['case']!r} "
            f"({ratio:.1f}x; limit {max_slowdown:g}x)")
    evidence = dict(facts, candidate=mine, baseline=base, ratio=ratio, decided_by="known-good")
    metrics = {"ratio": ratio, "median_ms": mine["median_ms"], "baseline_ms": base["median_ms"]}
    if ratio > max_slowdown:
        return GateResult("perf", False, f"perf failed: {line}", check="slowdown", diagnostics=(
            f"The kernel is {ratio:.0f}x slower than the known-good implementation on the same inputs. "
            "Parallelise the work across threads and blocks (one block per output row group, warp reductions); "
            "a single thread or a single block looping over every output is not acceptable."),
            metrics=metrics, evidence=evidence)
    if ratio * FLAG_FASTER < 1.0:
        evidence["flags"] = [f"{1 / ratio:.0f}x faster than the known-good (more than {FLAG_FASTER:g}x): "
                             "check the timed calls really did the work"]
        line += f"; FLAGGED: more than {FLAG_FASTER:g}x faster than the known-good"
    return GateResult("perf", True, f"perf ok: {line}", metrics=metrics, evidence=evidence)


def floor_ms(timing: dict) -> tuple[float | None, float]:
    """(the slowest time the floor allows, or None without a roofline; the fraction used)."""
    roof = timing.get("roofline_ms")
    frac = timing.get("perf_floor") or DEFAULT_FLOOR_FRACTION
    if not roof:
        return None, frac
    return LAUNCH_ALLOWANCE_MS + roof / frac, frac


def against_floor(mine: dict, facts: dict, no_baseline: str) -> GateResult:
    allowed, frac = floor_ms(mine)
    if allowed is None:
        return GateResult("perf", False, f"perf skipped: {no_baseline}, and no roofline (device peak unknown)",
                          skipped=True, evidence=dict(facts, candidate=mine))
    t = mine["median_ms"]
    line = (f"{t:.4g} ms on {mine['case']!r}; roofline {mine['roofline_ms']:.3g} ms for {mine.get('bytes')} bytes"
            f"{' / ' + str(mine['flops']) + ' FLOPs' if mine.get('flops') else ''}, floor {allowed:.4g} ms "
            f"({frac:g} of the roofline + {LAUNCH_ALLOWANCE_MS:g} ms launches; no known-good: {no_baseline})")
    evidence = dict(facts, candidate=mine, floor_ms=allowed, floor_fraction=frac,
                    launch_allowance_ms=LAUNCH_ALLOWANCE_MS, decided_by="roofline floor")
    metrics = {"median_ms": t, "floor_ms": allowed, "roofline_ms": mine["roofline_ms"]}
    if t > allowed:
        return GateResult("perf", False, f"perf failed: {line}", check="floor", diagnostics=(
            f"The kernel takes {t:.4g} ms where moving the data it must move takes {mine['roofline_ms']:.3g} ms at "
            f"the device's peak: below {frac:.0%} of the roofline. Parallelise the work across threads and blocks "
            "and coalesce the loads; a single thread or a single block looping over every output is not acceptable."),
            metrics=metrics, evidence=evidence)
    return GateResult("perf", True, f"perf ok: {line}", metrics=metrics, evidence=evidence)
