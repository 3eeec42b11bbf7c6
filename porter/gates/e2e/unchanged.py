"""The engine unchanged by a speedup: the backend with one new unit no worse than the committed backend.

`porter optimize` runs e2e on the whole backend with the candidate unit in place.  Where the
calibrated rule pins the greedy tokens (Rule.tokens_exact: minimoe), identical tokens and the
ceilings are the test, as for any backend.  Where it cannot (ds4 reduced: random weights make
ties), the ceilings are MARGIN (10x) above the worst known-good backend, room enough for a speedup
that quietly lowers precision; so there the backend must also be no worse than the committed
backend by more than the committed backend's own run-to-run spread, per stage, probe and the
logits:

    candidate's worst NMSE over its runs  <=  committed's worst over its runs + (committed max - min)

The committed backend's figures come from its passing e2e record at HEAD (the record prefill's
"verified" rests on), not from the calibration: that record measured this very backend on this
setup, while the calibration measured other backends (upstream's, porter's reference slices).
Each e2e record keeps its runs' figures ("run_figures": the worst NMSE per stage and probe, and the
logits', per prefill of the candidate library).  A record with one run (or an older record with
none, whose stored comparison is one worst-of-runs figure) has no measured spread: the allowance is
then zero, and the summary says so; nothing is assumed that was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from porter.gates.e2e.compare import Comparison

IGNORED_SETUP = ("device", "mode")  # facts about a run, not about what it compared (as gate.setup_mismatch)


def run_figures(cmp: Comparison) -> dict:
    """One prefill's figures: the worst NMSE over tokens per stage, each probe's, the logits'."""
    nmse = np.nan_to_num(np.asarray(cmp.stage_nmse, dtype=np.float64), nan=np.inf, posinf=np.inf)
    stages = np.max(nmse, axis=1) if nmse.size else np.zeros(len(cmp.stage_names))
    return {"stages": dict(zip(cmp.stage_names, (json_number(v) for v in stages))),
            "probes": {k: json_number(v) for k, v in cmp.probe_nmse.items()}, "logits": json_number(cmp.logits_nmse)}


def json_number(v) -> float | str:
    """A figure as evidence stores it: 'inf' for a non-finite one (as compare.Comparison.to_json)."""
    v = float(v)
    return v if np.isfinite(v) else "inf"


def _val(v) -> float:
    return float("inf") if v == "inf" else float(v)


def _quantities(fig: dict) -> dict[str, float]:
    """{what: NMSE} in forward order: 'layer 3', 'probe head', 'logits'."""
    out = {name: _val(v) for name, v in fig.get("stages", {}).items()}
    out.update({f"probe {k}": _val(v) for k, v in fig.get("probes", {}).items()})
    out["logits"] = _val(fig.get("logits", "inf"))
    return out


@dataclass(frozen=True)
class Baseline:
    """The committed backend's e2e figures at HEAD: per quantity its worst over runs and its spread."""

    worst: dict[str, float]
    spread: dict[str, float]
    runs: int
    commit: str | None

    @classmethod
    def of(cls, runs: list[dict], commit: str | None = None) -> "Baseline":
        per_run = [_quantities(f) for f in runs]
        names = list(per_run[0])
        worst = {q: max(r.get(q, float("inf")) for r in per_run) for q in names}
        spread = {q: worst[q] - min(r.get(q, float("inf")) for r in per_run) if np.isfinite(worst[q]) else 0.0
                  for q in names}
        return cls(worst, spread, len(per_run), commit)


def committed_baseline(records: list[dict], head_tree: str | None, setup: dict,
                       calibration_sha: str) -> tuple[Baseline | None, str]:
    """(the committed backend's baseline, '') from its newest passing e2e record on HEAD's backend tree,
    made on this setup with this calibration; (None, why not) otherwise."""
    passing = [r for r in records if r.get("gate") == "e2e" and r.get("ok") is True and head_tree
               and r.get("tree_hash") == head_tree]
    if not passing:
        return None, "the committed backend has no passing e2e record at HEAD"
    rec = passing[-1]
    if (rec.get("calibration") or {}).get("sha256") != calibration_sha:
        return None, "the committed backend's e2e record was judged by another calibration"
    then = {k: v for k, v in (rec.get("setup") or {}).items() if k not in IGNORED_SETUP}
    now = {k: v for k, v in (setup or {}).items() if k not in IGNORED_SETUP}
    if then != now:
        return None, "the committed backend's e2e record ran on another setup"
    runs = rec.get("run_figures")
    if not runs and rec.get("comparison"):
        runs = [run_figures(Comparison.from_json(rec["comparison"]))]  # older record: its worst, one figure
    if not runs:
        return None, "the committed backend's e2e record holds no figures"
    return Baseline.of(runs, rec.get("commit")), ""


def no_worse(candidate_runs: list[dict], base: Baseline) -> tuple[bool, str, str | None]:
    """(ok, one line, the first quantity over or None): the candidate backend's worst over its runs
    against the committed backend's worst plus its run-to-run spread, quantity by quantity in forward
    order; the first one over refuses."""
    cand = Baseline.of(candidate_runs).worst
    at = f"{base.runs} run(s) at {(base.commit or '?')[:12]}"
    if base.runs < 2:
        at += ": no spread measured, so no allowance"
    for q, ceiling in base.worst.items():
        allowed = ceiling + base.spread.get(q, 0.0)
        got = cand.get(q, float("inf"))
        if not got <= allowed:
            return False, (f"e2e: {q} is worse than the committed backend's: NMSE {got:.3e} > {ceiling:.3e} "
                           f"+ run-to-run spread {base.spread.get(q, 0.0):.1e} ({at})"), q
    return True, f"no worse than the committed backend ({len(base.worst)} figures within its spread; {at})", None
