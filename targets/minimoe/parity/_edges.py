"""Numerical edges shared by minimoe's parity specs (a helper, not a spec).

Each edge is a place where a right kernel stays exact and a fragile one breaks; the scripted
known-good answers (targets/minimoe/scripted/good) are stable at each: the attention and the
router subtract the row maximum before expf, the norms add eps inside the square root, and
swiglu takes g / (1 + expf(-g)).
"""
import numpy as np

# Rows near zero at the engine's eps 1e-6: scale 1e-5..1e-3 gives a mean square of 1e-10..1e-6,
# where eps sets the scale; an all-zero row is 0 / sqrt(eps) = 0 (NaN without eps).
NEAR_ZERO = (1e-5, 1e-3)
EDGE_NEAR_ZERO = "rows near zero at eps 1e-6 (mean square 1e-10..1e-6) and an all-zero row"


def norm_rows(rng, rows, n, lo=0.1, hi=10.0, near_zero=False):
    """Gaussian rows, each with its own scale log-uniform in lo..hi; near_zero: every other row at a
    scale in NEAR_ZERO and, of three or more rows, the last all zero."""
    scale = np.exp(rng.uniform(np.log(lo), np.log(hi), (rows, 1)))
    if near_zero:
        tiny = np.arange(rows) % 2 == (0 if rows == 1 else 1)
        scale[tiny] = np.exp(rng.uniform(np.log(NEAR_ZERO[0]), np.log(NEAR_ZERO[1]), (int(tiny.sum()), 1)))
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    if near_zero and rows >= 3:
        x[-1] = 0.0
    return x


NORM_INPUTS = ("rows ~ N(0, s^2), s log-uniform in 0.1..10 per row; weights: the fixture's or 1 + N(0, 0.3^2); "
               "'eps matters' cases: x ~ 0.03 with eps 1e-3; edge: rows near zero at eps 1e-6 and a zero row")

# Attention scores shifted by a common +200 (q = a*u + noise, every key = u + noise): softmax is
# shift-invariant, but expf overflows float32 past 88.7 without the maximum subtracted.
SCORE_SHIFT = 200.0
EDGE_SHIFTED = f"scores shifted by +{SCORE_SHIFT:g} (exp overflows float32 without the max subtracted)"


def shifted_qk(rng, n_tokens, n_pos, n_head, head_dim, scale, shift=SCORE_SHIFT, spread=1.5):
    """(q, k): scale * q.k = shift + N(0, ~spread^2) for every query and key."""
    u = rng.choice(np.array([-1.0, 1.0]), head_dim)
    a = shift / (scale * head_dim)
    noise = spread / (scale * a * np.sqrt(head_dim))
    q = (a * u + 0.3 * rng.standard_normal((n_tokens, n_head, head_dim))).astype(np.float32)
    k = (u + noise * rng.standard_normal((n_pos, head_dim))).astype(np.float32)
    return q, k


# Router logits shifted by +1000: the softmax (and the ranking) are unchanged, expf(1000) is inf.
LOGIT_SHIFT = 1000.0
EDGE_LOGITS = f"logits shifted by +{LOGIT_SHIFT:g} (softmax overflows expf without the max subtracted)"
