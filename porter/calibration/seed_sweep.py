"""The known-good's false-reject rate: each spec's known-good run on K fresh seed sets.

Calibration used to run the known-good on one set of seeds.  A tolerance that
upstream itself exceeds on some seeds then goes unseen until a candidate meets
those seeds (ds4's routed_moe_one refused upstream's own answer once in a full
run, "NMSE 3.471e-06 > 1.0e-06", and passed it on the next attempt).  So:

- the known-good runs on K seed sets per spec (`porter calibrate --seed-sets K`,
  default 20; the first set is the one its variants and mutants run with);
- a spec whose worst ratio after K sets is above ESCALATE_ABOVE (half its
  tolerance) gets ESCALATE_FACTOR x K sets in all: the specs near their
  tolerance are the ones whose tail matters;
- per case and output the record keeps the largest measured error as a fraction
  of its bound (the worst ratio: NMSE / its bound, max|err|/rms / its bound,
  max|err| / its bound, whichever is largest) and the seed set, seeds and call
  that produced it;
- THE RULE: a spec whose known-good fails on any seed set is not calibrated, and
  the record names that set's seeds and the case that failed, so it reproduces.
  A set the harness could not run (skipped) measured nothing: not calibrated
  either.  Nothing here picks or moves a tolerance: it reports the margin,
  1 - worst ratio (and tolerance / worst error, its reciprocal), per spec and
  per case, and a spec's author sets the tolerance from the arithmetic.

The first part is pure (aggregation, the rule, the escalation, the margin, the
record and its table: CPU-tested in tests/test_seed_sweep.py); `sweep` is the
thin part that calls a parity runner with explicit seeds (the calibrator gives
it parity_on_library, which sets ParityOptions.seeds).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from porter.gates.evidence import ParityEvidence

SWEEP_VERSION = 1  # the "seed_sweep" field of a calibration record; a record without it predates the sweep
DEFAULT_SETS = 20  # K: `porter calibrate --seed-sets`
ESCALATE_ABOVE = 0.5  # worst error / tolerance above which a spec gets more sets
ESCALATE_FACTOR = 2  # ... ESCALATE_FACTOR x K sets in all
BOUNDS = ("nmse", "max_err_rms", "max_abs")  # a Tol's bounds, in the order ties are named
INF = math.inf


# ---------------------------------------------------------------------------
# One output of one call against its tolerance
# ---------------------------------------------------------------------------

def bounds_of(tol) -> dict[str, float] | None:
    """A tolerance's numeric bounds ({"nmse": 1e-6, "max_err_rms": 1e-2}); None for an exact
    comparison (spec.Exact: nothing to be a fraction of).  Takes a spec.Tol or a mapping."""
    if isinstance(tol, dict):
        if not any(k in tol for k in BOUNDS):
            return None
        return {k: float(tol[k]) for k in BOUNDS if tol.get(k) is not None}
    if not all(hasattr(tol, k) for k in BOUNDS):
        return None
    return {k: float(getattr(tol, k)) for k in BOUNDS if getattr(tol, k) is not None}


@dataclass(frozen=True)
class Ratio:
    """How close one output of one call came to its tolerance."""

    ratio: float  # measured / bound, the largest over the output's bounds; inf: not finite, unwritten, exact miss
    metric: str  # the bound it is measured against (nmse, max_err_rms, max_abs), or nonfinite/unwritten/exact
    error: float | None  # the measured value (None: not finite)
    tolerance: float | None  # the bound (None where the failure is not a number against a bound)


def output_ratio(metrics: dict, tol) -> Ratio | None:
    """One output's metrics (as a parity result's evidence records them per case and call:
    {"nmse", "max_err_rms", "max_abs", "n_nonfinite"}, {"unwritten": n} or {"mismatch_rows": n})
    against its tolerance.  None where there is no ratio to speak of: an exact output that matched."""
    if not isinstance(metrics, dict):
        return None
    if metrics.get("unwritten"):
        return Ratio(INF, "unwritten", float(metrics["unwritten"]), None)
    bounds = bounds_of(tol)
    if bounds is None:
        miss = metrics.get("mismatch_rows")
        return Ratio(INF, "exact", float(miss), None) if miss else None
    if metrics.get("n_nonfinite"):
        return Ratio(INF, "nonfinite", float(metrics["n_nonfinite"]), None)
    worst: Ratio | None = None
    for name, bound in bounds.items():
        v = metrics.get(name)
        if v is None:
            r = INF
        elif bound == 0:
            r = 0.0 if float(v) == 0 else INF
        else:
            r = float(v) / bound
        if worst is None or r > worst.ratio:
            worst = Ratio(r, name, None if v is None else float(v), bound)
    return worst


# ---------------------------------------------------------------------------
# One seed set: a parity run's evidence, read per case and output
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseWorst:
    """The worst of one (case, output) over the calls of one seed set, or over the sets of a sweep."""

    case: str  # the shape's label
    output: str
    ratio: float
    metric: str
    error: float | None
    tolerance: float | None
    seed_set: int  # 1-based index of the seed set
    seed: str | None  # the seed of the call (hex, as the evidence writes seeds): that call reproduces it

    def as_record(self) -> dict:
        d = asdict(self)
        d["ratio"] = _finite(self.ratio)
        d["margin"] = _finite(margin(self.ratio))
        return d


@dataclass
class SeedSet:
    index: int  # 1-based
    seeds: list[str]  # hex, as the evidence writes them
    ok: bool
    skipped: bool = False  # the harness could not run it: nothing was measured
    check: str | None = None  # the check that refused the known-good (None when ok)
    summary: str = ""
    worst: list[CaseWorst] = field(default_factory=list)  # per (case, output)


def hex_seeds(seeds: Iterable[int]) -> list[str]:
    return [f"{int(s) & (2**64 - 1):016x}" for s in seeds]


def read_set(index: int, seeds: list[int] | list[str], result, tolerances: dict) -> SeedSet:
    """A parity GateResult of the known-good (ok, skipped, check, summary, evidence) as one seed set.
    `tolerances`: {output: Tol | Exact} (the spec's outputs).  Ratios come from the evidence's cases:
    each case's calls ("passes", "seed_index" p ran on the set's p-th seed) and their metrics."""
    ev = ParityEvidence.of(getattr(result, "evidence", None))
    # the seeds it was asked to run on (the evidence names the same ones; a run given none names its own)
    hexes = (hex_seeds(seeds) if not isinstance(seeds[0], str) else list(seeds)) if seeds else list(ev.seeds or [])
    best: dict[tuple[str, str], CaseWorst] = {}
    for case in ev.cases or []:
        if not isinstance(case, dict):
            continue
        label = str(case.get("label") or case.get("id") or "?")
        for p in case.get("passes") or []:
            if not isinstance(p, dict):
                continue
            k = p.get("seed_index")
            seed = hexes[k] if isinstance(k, int) and 0 <= k < len(hexes) else None
            for out, m in (p.get("metrics") or {}).items():
                if out not in tolerances:
                    continue  # a scenario's steps: their bounds live in its script, not in the spec's outputs
                r = output_ratio(m, tolerances[out])
                if r is None:
                    continue
                cw = CaseWorst(label, out, r.ratio, r.metric, r.error, r.tolerance, index, seed)
                if (label, out) not in best or cw.ratio > best[(label, out)].ratio:
                    best[(label, out)] = cw
    return SeedSet(index, list(hexes), bool(getattr(result, "ok", False)), bool(getattr(result, "skipped", False)),
                   getattr(result, "check", None), str(getattr(result, "summary", ""))[:300], list(best.values()))


# ---------------------------------------------------------------------------
# Over the sets: worst per case, the rule, escalation, margin
# ---------------------------------------------------------------------------

def worst_per_case(sets: list[SeedSet]) -> list[CaseWorst]:
    """Per (case, output), the largest ratio over every set (the earliest set on ties), in the order
    the cases first appear."""
    best: dict[tuple[str, str], CaseWorst] = {}
    for s in sets:
        for cw in s.worst:
            key = (cw.case, cw.output)
            if key not in best or cw.ratio > best[key].ratio:
                best[key] = cw
    return list(best.values())


def worst_overall(sets: list[SeedSet]) -> CaseWorst | None:
    """The largest ratio over every set, case and output; None when nothing had a bound."""
    per = worst_per_case(sets)
    return max(per, key=lambda c: c.ratio) if per else None


def first_failure(sets: list[SeedSet]) -> SeedSet | None:
    """The first seed set on which the known-good was refused (or that could not run)."""
    return next((s for s in sorted(sets, key=lambda s: s.index) if not s.ok or s.skipped), None)


def rule(sets: list[SeedSet]) -> tuple[bool, str]:
    """THE RULE: (calibrated as far as the seed sweep goes, why not).  Every set must have run and
    passed: one refused set in twenty is a spec that refuses correct code one time in twenty."""
    if not sets:
        return False, "the known-good ran on no seed set"
    bad = first_failure(sets)
    if bad is None:
        return True, ""
    n = len(sets)
    seeds = ", ".join(bad.seeds) or "unknown seeds"
    if bad.skipped:
        return False, f"seed set {bad.index} of {n} (seeds {seeds}) could not run: {bad.summary}"[:300]
    return False, f"the known-good was refused on seed set {bad.index} of {n} (seeds {seeds}): {bad.summary}"[:300]


def more_sets(sets: list[SeedSet], k: int, threshold: float = ESCALATE_ABOVE,
              factor: int = ESCALATE_FACTOR) -> int:
    """How many more sets to run after the first `k`: up to factor x k in all when the worst ratio is
    above `threshold` (a spec close to its tolerance), none otherwise.  None are added to a sweep that
    already failed (it is refused whatever more sets show) or to a single run (k = 1: no sweep)."""
    if k <= 1 or len(sets) < k or first_failure(sets) is not None:
        return 0
    w = worst_overall(sets)
    if w is None or not w.ratio > threshold:
        return 0
    return max(0, factor * k - len(sets))


def margin(ratio: float | None) -> float | None:
    """1 - worst error / tolerance: how much of the tolerance the known-good never used (negative: refused)."""
    return None if ratio is None else 1.0 - ratio


def headroom(ratio: float | None) -> float | None:
    """tolerance / worst error: the factor by which the known-good's worst stayed inside its tolerance."""
    if ratio is None:
        return None
    return INF if ratio == 0 else 1.0 / ratio


def _finite(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


# ---------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------

def summary(sets: list[SeedSet], k: int, threshold: float = ESCALATE_ABOVE) -> dict:
    """The sweep as a calibration record carries it (versioned, JSON-safe: an infinite ratio is None
    with its metric saying why).  `cases`: the worst per case and output, each with the seed set and
    seed that produced it; `failed`: the first set that failed, its seeds, check and first failure."""
    ok, why = rule(sets)
    w = worst_overall(sets)
    bad = first_failure(sets)
    return {
        "version": SWEEP_VERSION,
        "asked": k, "sets": len(sets), "escalated": len(sets) > k, "escalate_above": threshold,
        "ok": ok, "reason": why,
        "worst": w.as_record() if w else None,
        "margin": _finite(margin(w.ratio)) if w else None,
        "headroom": _finite(headroom(w.ratio)) if w else None,
        "failed": ({"seed_set": bad.index, "seeds": bad.seeds, "check": bad.check, "skipped": bad.skipped,
                    "summary": bad.summary} if bad else None),
        "cases": [c.as_record() for c in worst_per_case(sets)],
        "seed_sets": [{"index": s.index, "seeds": s.seeds, "ok": s.ok and not s.skipped} for s in sets],
    }


def compact(sweep: dict) -> dict:
    """What a ledger line keeps of a sweep (the per-case table goes to the evidence): the counts, the
    rule's verdict, the worst and the first failure."""
    return {k: sweep.get(k) for k in ("version", "asked", "sets", "escalated", "escalate_above", "ok", "reason",
                                       "worst", "margin", "headroom", "failed")}


def read_record(record) -> dict | None:
    """A calibration record's sweep (a history.Calibration, or its raw dict); None for a record made
    before the sweep existed, or one whose sweep this porter cannot read (another version)."""
    raw = getattr(record, "raw", record)
    sweep = raw.get("seed_sweep") if isinstance(raw, dict) else None
    if not isinstance(sweep, dict) or sweep.get("version") != SWEEP_VERSION:
        return None
    return sweep


# ---------------------------------------------------------------------------
# The thin part: the runs
# ---------------------------------------------------------------------------

def sweep(run: Callable[[list[int]], object], tolerances: dict, k: int, first: tuple[list[int], object] | None = None,
          fresh: Callable[[], list[int]] | None = None, map_fn: Callable[[list], list] | None = None,
          threshold: float = ESCALATE_ABOVE, factor: int = ESCALATE_FACTOR) -> list[SeedSet]:
    """Run the known-good on `k` seed sets (then more, by more_sets) and read each.
    run(seeds) -> a parity GateResult on exactly those seeds; `first`: (seeds, result) of a run already
    made (the calibration's own known-good run, set 1); fresh() -> a new seed pair (default: the parity
    gate's os.urandom seeds); map_fn: runs a list of thunks side by side (the calibration's run slots)."""
    if fresh is None:  # the parity gate's own: os.urandom, never a seed anyone saw
        from porter.gates.parity.gate import fresh_seeds

        fresh = fresh_seeds
    mapper = map_fn or (lambda fns: [f() for f in fns])
    sets: list[SeedSet] = []
    if first is not None:
        sets.append(read_set(1, first[0], first[1], tolerances))

    def batch(n: int) -> None:
        seeds = [list(fresh()) for _ in range(n)]
        results = mapper([lambda s=s: run(s) for s in seeds])
        for s, r in zip(seeds, results):
            sets.append(read_set(len(sets) + 1, s, r, tolerances))

    batch(max(0, k - len(sets)))
    extra = more_sets(sets, k, threshold, factor)
    if extra:
        batch(extra)
    return sets


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

MARGIN_LEGEND = ("worst: the known-good's largest error as a fraction of its tolerance over every seed set, case and "
                 "output (1 or more: refused); margin = 1 - worst; sets: seed sets run (more than asked where the "
                 f"worst passed {ESCALATE_ABOVE:g} of the tolerance); a spec refused on any set is not calibrated")


def ratio_text(r: float | None) -> str:
    if r is None:
        return "-"
    return "inf" if not math.isfinite(r) else f"{r:.2g}"


def margin_table(report: dict, prefix: str = "", width: int | None = None) -> str:
    """Per spec: seed sets run, the worst error/tolerance ratio, the margin, and where the worst was
    (case, output, metric, set); empty when the report holds no sweep."""
    import textwrap

    from porter.term import Column, Table

    sweeps = report.get("seed_sweep") or {}
    if not sweeps:
        return ""
    t = Table([Column("unit", key=True), Column("sets", right=True), Column("worst", right=True),
               Column("margin", right=True)], tail="worst at", rule=False, tail_style=None)
    for unit, s in sweeps.items():
        w = s.get("worst")
        name = unit.removeprefix(prefix).removesuffix("_tensor")
        sets = f"{s.get('sets', 0)}" + ("+" if s.get("escalated") else "")
        if w is None:
            where = "no toleranced output (exact comparisons, or a scenario)"
            ratio, m = "-", "-"
        else:
            r = w.get("ratio")
            ratio = ratio_text(INF if r is None else r)
            m = "-" if w.get("margin") is None else f"{100 * w['margin']:.0f}%"
            where = f"{w['output']} {w['metric']}, {w['case']!r} (set {w['seed_set']})"
        failed = s.get("failed")
        if failed:
            where = f"REFUSED on set {failed['seed_set']} (seeds {', '.join(failed['seeds'])}); {where}"
        t.add_row(name, sets, ratio, m, tail=where)
    legend = textwrap.fill(MARGIN_LEGEND, width) if width else MARGIN_LEGEND
    return t.text(width) + "\n" + legend
