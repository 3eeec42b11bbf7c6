"""When is a new kernel faster than the committed one?  A rank test on per-round medians, and a
minimum gain no A/A comparison reaches.

Each side is timed in several rounds, each a fresh sandboxed process on fresh inputs (ab.py);
one round gives one observation, its median.  Calls within one process share its caches, clocks
and allocation, so they are not independent: pooling them would make a rank test see "wins" that
are only one process's luck.  Rounds are.

The new kernel wins when, both:
  - a one-sided Mann-Whitney U test says its round medians are lower at ALPHA, and
  - its median is lower by more than the minimum gain: MIN_GAIN, or the A/A margin when larger.

The A/A margin is measured on the committed kernel's own rounds: over every split of them into
two halves, the largest relative difference of the halves' medians.  It is what the committed
kernel "gains" against itself; a gain inside it is noise whatever the p-value.  Anything else is
"inconclusive" (or "slower"), recorded and not committed.

Why A/A cannot win: the exact test is a permutation test, so whatever the distribution of the
round medians, when both sides are the same kernel P(p < ALPHA) <= ALPHA; the A/A margin only
lowers it further.  Synthetic trials (10 rounds a side; lognormal 3%, heavy-tailed and exponential
noise): at ALPHA 1e-4, 2 A/A wins in 5000 lognormal trials and none in the others, while a real
10% gain still won 98% of its trials (at ALPHA 0.01, A/A won 14-20 of 4000).  ROUNDS = 10 a side
because the smallest exact p at 10 vs 10 is 1/C(20,10) = 5.4e-6, below ALPHA with room to spare;
below MIN_ROUNDS no order of the rounds reaches ALPHA (7 vs 7: 1/3432 = 2.9e-4), so fewer is refused
rather than reported inconclusive.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass

ALPHA = 1e-4  # one-sided: the new kernel is faster (an A/A comparison wins with probability <= ALPHA)
MIN_GAIN = 0.01  # |delta median| / old median (seed 004's rule: p < 0.05 and > 1%; stricter p here)
ROUNDS = 10  # per side, what the speedup gate runs: 10 vs 10 reaches p = 5.4e-6 when fully separated
MIN_ROUNDS = 8  # per side: the fewest at which a win is possible at ALPHA (8 vs 8: p >= 7.8e-5); decide raises


@dataclass
class Decision:
    verdict: str  # faster | inconclusive | slower
    p_value: float
    u_statistic: float
    gain: float  # (old median - new median) / old median
    aa_margin: float
    min_gain: float
    alpha: float
    old_median_ms: float
    new_median_ms: float
    why: str

    @property
    def wins(self) -> bool:
        return self.verdict == "faster"

    def as_dict(self) -> dict:
        return asdict(self)


def mann_whitney_less(new: list[float], old: list[float]) -> tuple[float, float]:
    """(U of NEW, one-sided p that NEW is stochastically smaller than OLD).  Exact over every
    assignment of the pooled ranks when it is small enough (ties get mid-ranks), else the normal
    approximation with tie correction and continuity correction."""
    n1, n2 = len(new), len(old)
    if n1 == 0 or n2 == 0:
        raise ValueError("both sides need at least one round")
    pooled = sorted([(v, 0) for v in new] + [(v, 1) for v in old])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    r_new = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u_new = r_new - n1 * (n1 + 1) / 2  # small when NEW holds the low ranks
    if n1 + n2 <= 200:
        return u_new, _exact_p(ranks, n1, r_new)
    n = n1 + n2
    ties = {}
    for v, _ in pooled:
        ties[v] = ties.get(v, 0) + 1
    tie_term = sum(t ** 3 - t for t in ties.values()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term))
    if sigma == 0:
        return u_new, 1.0
    z = (u_new - n1 * n2 / 2 + 0.5) / sigma
    return u_new, 0.5 * math.erfc(-z / math.sqrt(2))


def _exact_p(ranks: list[float], n1: int, r_new: float) -> float:
    """P(rank sum of N1 ranks drawn without replacement <= R_NEW), counted exactly by dynamic programming
    over the (doubled, so integral) mid-ranks: the permutation distribution, ties included."""
    doubled = [int(round(2 * r)) for r in ranks]
    top = sum(sorted(doubled)[-n1:])
    ways = [[0] * (top + 1) for _ in range(n1 + 1)]  # ways[k][s]: k ranks chosen summing to s
    ways[0][0] = 1
    for r in doubled:
        for k in range(n1, 0, -1):
            row, prev = ways[k], ways[k - 1]
            for s in range(top, r - 1, -1):
                if prev[s - r]:
                    row[s] += prev[s - r]
    limit = int(round(2 * r_new))
    return sum(ways[n1][: limit + 1]) / math.comb(len(ranks), n1)


def aa_margin(rounds: list[float]) -> float:
    """The largest relative median difference between two halves of one kernel's own rounds."""
    n = len(rounds)
    if n < 2:
        return float("inf")
    whole = statistics.median(rounds)
    half = n // 2
    worst = 0.0
    for pick in itertools.combinations(range(n), half):
        a = [rounds[i] for i in pick]
        b = [rounds[i] for i in range(n) if i not in pick]
        worst = max(worst, abs(statistics.median(a) - statistics.median(b)) / whole)
    return worst


def decide(old: list[float], new: list[float], *, alpha: float = ALPHA, min_gain: float = MIN_GAIN) -> Decision:
    """The verdict on round medians (ms) of the committed kernel (OLD) and the candidate (NEW)."""
    if len(old) < MIN_ROUNDS or len(new) < MIN_ROUNDS:
        raise ValueError(f"at least {MIN_ROUNDS} rounds per side (got {len(old)} and {len(new)})")
    u, p = mann_whitney_less(new, old)
    m_old, m_new = statistics.median(old), statistics.median(new)
    gain = (m_old - m_new) / m_old
    margin = aa_margin(old)
    need = max(min_gain, margin)
    if p < alpha and gain > need:
        verdict, why = "faster", f"{gain:.1%} faster (p={p:.2g} < {alpha:g}; A/A margin {margin:.1%})"
    elif gain < -need and mann_whitney_less(old, new)[1] < alpha:
        verdict, why = "slower", f"{-gain:.1%} slower"
    else:
        reasons = []
        if p >= alpha:
            reasons.append(f"p={p:.2g} not below {alpha:g}")
        if gain <= need:
            reasons.append(f"gain {gain:.1%} not above {need:.1%} ("
                           + ("the A/A margin" if margin > min_gain else "the minimum gain") + ")")
        verdict, why = "inconclusive", "; ".join(reasons)
    return Decision(verdict, p, u, gain, margin, need, alpha, m_old, m_new, why)
