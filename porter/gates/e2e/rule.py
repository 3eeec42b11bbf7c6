"""The e2e decision rule: a per-stage NMSE ceiling, a logits ceiling, and optionally exact greedy tokens.

The ceilings are not chosen by hand: porter.gates.e2e.calibration derives them
from known-good backends and proves them against broken ones.  A verdict that
rejects names where: the first stage (in forward order) with a token over its
ceiling, that token, and how far over it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from porter.gates.e2e.compare import Comparison, agreement_line


@dataclass(frozen=True)
class Rule:
    stage_names: tuple[str, ...]
    stage_tol: tuple[float, ...]  # NMSE ceiling per stage
    logits_tol: float
    tokens_exact: bool  # greedy tokens must be identical (minimoe); False where random weights make ties (ds4)
    probe_names: tuple[str, ...] = ()  # vectors besides the stages (compare.py), checked after them
    probe_tol: tuple[float, ...] = ()  # NMSE ceiling per probe

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("stage_names", "stage_tol", "probe_names", "probe_tol"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Rule":
        return cls(tuple(d["stage_names"]), tuple(float(x) for x in d["stage_tol"]), float(d["logits_tol"]),
                   bool(d["tokens_exact"]), tuple(d.get("probe_names", ())),
                   tuple(float(x) for x in d.get("probe_tol", ())))


@dataclass
class Verdict:
    ok: bool
    reason: str  # one line
    stage: str | None = None  # where it first failed
    token: int | None = None
    worst_ratio: float = 0.0  # max over stages/tokens of nmse / ceiling (>1 is a rejection)
    bad_tokens: list[int] | None = None  # every token over the ceiling at the first failing stage

    def to_json(self) -> dict:
        return {"ok": self.ok, "reason": self.reason, "stage": self.stage, "token": self.token,
                "worst_ratio": self.worst_ratio if np.isfinite(self.worst_ratio) else "inf",
                "bad_tokens": self.bad_tokens}


def ratios(cmp: Comparison, rule: Rule) -> np.ndarray:
    tol = np.asarray(rule.stage_tol, dtype=np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = cmp.stage_nmse / tol
    return np.where(np.isnan(r), np.inf, r)


def decide(cmp: Comparison, rule: Rule) -> Verdict:
    if cmp.problem:
        return Verdict(False, f"e2e: {cmp.problem}", worst_ratio=float("inf"))
    if tuple(cmp.stage_names) != rule.stage_names:
        return Verdict(False, f"e2e: stages {cmp.stage_names} are not the calibrated {list(rule.stage_names)}",
                       worst_ratio=float("inf"))
    r = ratios(cmp, rule)
    probe = [(name, cmp.probe_nmse.get(name, float("inf")), tol) for name, tol in zip(rule.probe_names, rule.probe_tol)]
    probe_r = [v / tol if tol > 0 and np.isfinite(v) else np.inf for _, v, tol in probe]
    worst = float(max(np.max(r), *probe_r, cmp.logits_nmse / rule.logits_tol if rule.logits_tol > 0 else np.inf))
    over = r > 1.0
    if over.any():
        s = int(np.argmax(over.any(axis=1)))
        bad = [int(t) for t in np.flatnonzero(over[s])]
        t = bad[0]
        return Verdict(False, f"e2e: {cmp.stage_names[s]} diverges first, at token {t} "
                              f"(NMSE {cmp.stage_nmse[s, t]:.2e} > {rule.stage_tol[s]:.2e}; "
                              f"{len(bad)}/{r.shape[1]} tokens over)",
                       cmp.stage_names[s], t, worst, bad)
    for (name, v, tol), pr in zip(probe, probe_r):
        if not pr <= 1.0:
            return Verdict(False, f"e2e: {name} diverges (NMSE {v:.2e} > {tol:.2e}; every stage within its ceiling)",
                           name, None, worst)
    if not cmp.logits_nmse <= rule.logits_tol:
        return Verdict(False, f"e2e: prefill logits NMSE {cmp.logits_nmse:.2e} > {rule.logits_tol:.2e} "
                              f"(every stage within its ceiling)", "logits", None, worst)
    if rule.tokens_exact:
        i = cmp.first_token_mismatch
        if i is not None:
            a = cmp.tokens_ref[i] if i < len(cmp.tokens_ref) else None
            b = cmp.tokens_cand[i] if i < len(cmp.tokens_cand) else None
            return Verdict(False, f"e2e: greedy token {i} is {b}, the reference's is {a}", "tokens", i, worst)
    field = agreement_line(cmp.agreement)
    return Verdict(True, f"e2e ok: {len(rule.stage_names)} stages x {r.shape[1]} tokens"
                         + (f" and {', '.join(rule.probe_names)}" if rule.probe_names else "") + " within the calibrated "
                         f"ceilings (worst at {worst:.2g} of its ceiling)"
                         + (f"; {len(cmp.tokens_ref)} greedy tokens identical" if rule.tokens_exact else "")
                         + (f"; {field}" if field else ""),
                   worst_ratio=worst)
