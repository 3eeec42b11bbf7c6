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

No calibrated baseline, or a spec changed since calibration: the gate is
skipped (never ok), and the unit can still be verified by parity alone; status
and audit show the skipped perf record.
"""

from __future__ import annotations

from porter.evidence import load_evidence
from porter.gates.result import GateResult

DEFAULT_MAX_SLOWDOWN = 8.0


def perf_settings(target) -> tuple[bool, float]:
    perf = getattr(target.spec, "perf", None) or {}
    return bool(perf.get("enabled", True)), float(perf.get("max_slowdown", DEFAULT_MAX_SLOWDOWN))


def baseline(history, unit: str, spec_sha256: str | None) -> tuple[dict | None, str]:
    """The latest ok calibration's known-good timing for this exact spec, or (None, why not)."""
    recs = history.calibrations(unit)
    if not recs:
        return None, "no calibration of this unit's spec (run `porter calibrate`)"
    current = [r for r in recs if r.ok and r.spec_sha256 == spec_sha256 and r.evidence]
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
    facts = {"target": target.name, "unit": unit, "gate": "perf", "candidate_sha256": cand_sha,
             "max_slowdown": max_slowdown, "toolchain": parity.evidence.get("toolchain", {})}
    if not enabled:
        return GateResult("perf", False, "perf gate off ([perf] enabled = false)", skipped=True, evidence=facts)
    mine = parity.evidence.get("timing")
    if not mine or not mine.get("median_ms"):
        return GateResult("perf", False, "perf skipped: the parity run recorded no timing", skipped=True,
                          evidence=facts)
    spec_sha = (parity.evidence.get("spec") or {}).get("sha256")
    base, why = baseline(ctx.history, unit, spec_sha)
    if base is None:
        return GateResult("perf", False, f"perf skipped: {why}", skipped=True, evidence=dict(facts, candidate=mine))
    if base.get("case") != mine.get("case"):
        return GateResult("perf", False, f"perf skipped: baseline timed {base.get('case')!r}, candidate "
                          f"{mine.get('case')!r}", skipped=True, evidence=dict(facts, candidate=mine, baseline=base))
    ratio = mine["median_ms"] / base["median_ms"]
    line = (f"{mine['median_ms']:.4g} ms vs known-good {base['median_ms']:.4g} ms on {mine['case']!r} "
            f"({ratio:.1f}x; limit {max_slowdown:g}x)")
    evidence = dict(facts, candidate=mine, baseline=base, ratio=ratio)
    metrics = {"ratio": ratio, "median_ms": mine["median_ms"], "baseline_ms": base["median_ms"]}
    if ratio > max_slowdown:
        return GateResult("perf", False, f"perf failed: {line}", check="slowdown", diagnostics=(
            f"The kernel is {ratio:.0f}x slower than the known-good implementation on the same inputs. "
            "Parallelise the work across threads and blocks (one block per output row group, warp reductions); "
            "a single thread or a single block looping over every output is not acceptable."),
            metrics=metrics, evidence=evidence)
    return GateResult("perf", True, f"perf ok: {line}", metrics=metrics, evidence=evidence)
