"""The throughput verdict's arithmetic: upstream's engine and the port's, side by side, judged by porter.

One sample is one engine run (prefill of a prompt, then a greedy decode at that depth), as the checker
saw it: `wall_s` is measured by porter around the process, from spawn to exit; the phase times are what
the engine wrote, which the candidate's code can rewrite (it runs in that process), so they are data to
validate, never a verdict:

- every figure present, finite and positive, the phases fitting inside the wall porter measured;
- the time outside the phases ("unaccounted": model load, setup, teardown) no larger for the candidate
  than for upstream beyond their noise.  Work that a forged report moves out of its timing windows
  lands there, so a candidate can understate its phases by at most that noise (`resolution_s` in the
  evidence), and a report that hides more is refused as inconsistent, never accepted.

Runs alternate ABBA (upstream, candidate, candidate, upstream) per round, so drift in clocks or heat
falls on both sides equally.  Upstream against itself gives the margin: the spread of its own runs
relative to their median.  A phase is slow when the candidate's median time exceeds upstream's by more
than that margin *and* an exact permutation test over the run labels says the difference is not
chance (p < ALPHA): noise alone never refuses, and a real slowdown hidden by noise is reported with
its p-value rather than called fast with confidence it does not have.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

UPSTREAM, CANDIDATE = "upstream", "candidate"
PHASES = ("prefill", "decode")
ALPHA = 0.05
# The exact test enumerates every split of the runs into two labelled groups; past this many splits it
# draws this many at random instead (seeded: the same samples give the same p-value).
EXACT_LIMIT = 20000


@dataclass
class Sample:
    backend: str  # UPSTREAM | CANDIDATE
    wall_s: float  # porter's clock around the engine process
    prefill_tokens: int
    prefill_s: float  # the engine's report
    decode_tokens: int
    decode_s: float

    def seconds(self, phase: str) -> float:
        return self.prefill_s if phase == "prefill" else self.decode_s

    def tokens(self, phase: str) -> int:
        return self.prefill_tokens if phase == "prefill" else self.decode_tokens

    @property
    def unaccounted_s(self) -> float:
        return self.wall_s - self.prefill_s - self.decode_s


def abba_order(rounds: int) -> list[str]:
    if rounds < 1:
        raise ValueError("throughput needs at least one ABBA round")
    return [UPSTREAM, CANDIDATE, CANDIDATE, UPSTREAM] * rounds


@dataclass
class PhaseVerdict:
    phase: str
    ok: bool
    upstream_tps: float
    candidate_tps: float
    ratio: float  # candidate tokens/s over upstream's (>1: faster)
    margin: float  # upstream against itself: (max - min) / median of its phase times
    p_value: float  # one-sided: the candidate's times are larger than upstream's by chance
    reason: str

    def to_json(self) -> dict:
        return {"phase": self.phase, "ok": self.ok, "upstream_tps": _r(self.upstream_tps),
                "candidate_tps": _r(self.candidate_tps), "ratio": _r(self.ratio), "margin": _r(self.margin),
                "p_value": _r(self.p_value), "reason": self.reason}


@dataclass
class Verdict:
    ok: bool
    reason: str
    phases: list[PhaseVerdict] = field(default_factory=list)
    consistency: dict = field(default_factory=dict)
    skipped: bool = False  # upstream's own runs could not be judged: nothing to compare with

    def to_json(self) -> dict:
        return {"ok": self.ok, "reason": self.reason, "phases": [p.to_json() for p in self.phases],
                "consistency": self.consistency, "skipped": self.skipped}


def problem_of(s: Sample, expect_prefill: int, expect_decode: int) -> str | None:
    """What is wrong with one sample's report, or None; anything wrong is the run's failure."""
    figures = (s.wall_s, s.prefill_s, s.decode_s)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in figures):
        return f"a {s.backend} run reported times that are not positive finite numbers ({figures})"
    if (s.prefill_tokens, s.decode_tokens) != (expect_prefill, expect_decode):
        return (f"a {s.backend} run reported {s.prefill_tokens} prefill and {s.decode_tokens} decode tokens, "
                f"not the {expect_prefill} and {expect_decode} it was asked for")
    if s.prefill_s + s.decode_s > s.wall_s:
        return (f"a {s.backend} run reported {s.prefill_s + s.decode_s:.3f} s of prefill and decode inside a "
                f"process porter timed at {s.wall_s:.3f} s")
    return None


def consistency(samples: list[Sample]) -> tuple[str | None, dict]:
    """(problem or None, facts): the candidate's unaccounted time against upstream's noise."""
    up = np.array([s.unaccounted_s for s in samples if s.backend == UPSTREAM])
    cand = np.array([s.unaccounted_s for s in samples if s.backend == CANDIDATE])
    noise = float(up.max() - up.min())
    # upstream's spread is the resolution: a candidate could understate its phases by up to this much
    # and stay unseen; the bound is on its median, so one slow start does not refuse it
    limit = float(up.max()) + noise
    facts = {"upstream_unaccounted_s": [_r(v) for v in up], "candidate_unaccounted_s": [_r(v) for v in cand],
             "limit_s": _r(limit), "resolution_s": _r(noise)}
    med = float(np.median(cand))
    if med > limit:
        return (f"the candidate's engine spent {med:.2f} s outside the phases it reported (median), upstream's at "
                f"most {up.max():.2f} s (+{noise:.2f} s noise): its reported times do not account for the wall "
                f"time porter measured (a slower model load or setup, or a report that understates its phases; "
                f"either way not as fast as upstream)"), facts
    return None, facts


def permutation_p(upstream: np.ndarray, candidate: np.ndarray) -> float:
    """One-sided exact permutation test on mean log time: the share of relabellings whose candidate-minus-
    upstream difference is at least the observed one (the observed labelling included, so p > 0)."""
    x = np.concatenate([np.log(upstream), np.log(candidate)])
    n, k = len(x), len(candidate)
    observed = x[len(upstream):].mean() - x[:len(upstream)].mean()
    total = x.sum()

    def diff(idx) -> float:
        s = x[list(idx)].sum()
        return s / k - (total - s) / (n - k)

    if math.comb(n, k) <= EXACT_LIMIT:
        splits = itertools.combinations(range(n), k)
        hits = count = 0
        for idx in splits:
            count += 1
            hits += diff(idx) >= observed - 1e-12
        return hits / count
    rng = np.random.default_rng(0)
    hits = 1 + sum(diff(rng.choice(n, k, replace=False)) >= observed - 1e-12 for _ in range(EXACT_LIMIT))
    return hits / (EXACT_LIMIT + 1)


def judge_phase(samples: list[Sample], phase: str, alpha: float = ALPHA) -> PhaseVerdict:
    up = np.array([s.seconds(phase) for s in samples if s.backend == UPSTREAM])
    cand = np.array([s.seconds(phase) for s in samples if s.backend == CANDIDATE])
    tokens = samples[0].tokens(phase)
    up_med, cand_med = float(np.median(up)), float(np.median(cand))
    margin = float((up.max() - up.min()) / up_med)
    p = permutation_p(up, cand)
    ratio = up_med / cand_med
    up_tps, cand_tps = tokens / up_med, tokens / cand_med
    slower = cand_med > up_med * (1 + margin)
    ok = not (slower and p < alpha)
    figures = (f"{phase} {cand_tps:.1f} t/s against upstream's {up_tps:.1f} ({ratio:.2f}x; A/A margin "
               f"{margin:.1%}, p={p:.3f})")
    if ok:
        why = "fast" if not slower else f"not shown slow (p={p:.3f} >= {alpha})"
        return PhaseVerdict(phase, True, up_tps, cand_tps, ratio, margin, p, f"{figures}: {why}")
    return PhaseVerdict(phase, False, up_tps, cand_tps, ratio, margin, p,
                        f"{figures}: slower than upstream beyond its own run-to-run margin")


def decide(samples: list[Sample], expect_prefill: int, expect_decode: int, alpha: float = ALPHA) -> Verdict:
    """The verdict on ABBA samples: a malformed or inconsistent report refuses (it is the candidate's
    failure), else each phase is judged, and both must be fast."""
    for s in samples:
        problem = problem_of(s, expect_prefill, expect_decode)
        if problem and s.backend == UPSTREAM:  # upstream's process loads no candidate code
            return Verdict(False, f"throughput skipped: upstream's run is not judgeable: {problem}", skipped=True)
        if problem:
            return Verdict(False, f"throughput refused: {problem}")
    if {s.backend for s in samples} != {UPSTREAM, CANDIDATE} or len(samples) < 4:
        return Verdict(False, "throughput refused: too few runs of each backend to judge")
    problem, facts = consistency(samples)
    if problem:
        return Verdict(False, f"throughput refused: {problem}", consistency=facts)
    phases = [judge_phase(samples, ph, alpha) for ph in PHASES]
    ok = all(p.ok for p in phases)
    return Verdict(ok, "; ".join(p.reason for p in phases), phases, facts)


def _r(v: float) -> float:
    return float(f"{float(v):.6g}")
