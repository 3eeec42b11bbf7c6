"""Shared inputs of the ds4 hc/norm/router parity specs (a helper, not a spec: the
leading '_' keeps load_specs from reading it as one).

Sizes are ds4's (ds4.c DS4_N_*): 4096-wide embedding, 4 hyper-connection streams
(hc state 16384 per token), a 24-value HC control vector per token (4 pre, 4
post, 4 x 4 combine), 20 Sinkhorn iterations, eps 1e-6, 64 heads x 512, q LoRA
1024, kv 512, 256 experts of which 6 are used, 43 layers, 129280 vocabulary rows.
"""
import numpy as np

from porter.spec import Context
from reference import ds4_ops as ops

N_EMBD = ops.N_EMBD
N_HC = ops.N_HC
HC_DIM = N_EMBD * N_HC
MIX = 2 * N_HC + N_HC * N_HC  # 24
SINKHORN_ITERS = 20           # ds4.c DS4_N_HC_SINKHORN_ITER
HC_EPS = 1e-6                 # ds4.c DS4_HC_EPS
RMS_EPS = ops.RMS_EPS
N_LORA_Q = 1024               # ds4.c DS4_N_LORA_Q
N_LAYER = 43                  # ds4.c DS4_N_LAYER
N_VOCAB = 129280              # ds4.c DS4_N_VOCAB


NORM_INPUTS = ("rows ~ N(0, s^2), s log-uniform in 0.1..10 per row (a norm over the wrong row shows); "
               "weights ~ U(0.25, 2); 'eps dominates' cases: eps 0.5 with small x; edge: rows near zero "
               "at ds4's eps and an all-zero row")
HC_INPUTS = ("hc state rows ~ N(0, s^2), s log-uniform in 0.1..10 per row; HC control vectors ~ N(0, 1.5^2); "
             "scales pre/post/combine ~ U(0.5, 0.9), U(1.2, 1.6), U(1.8, 2.4), base ~ N(0, 0.7^2)")

# Rows near zero at ds4's own eps (1e-6): a row of scale 1e-5..1e-3 has a mean square of 1e-10..1e-6,
# where eps sets (or shares) the scale, and an all-zero row is 0 * rsqrt(eps) = 0 -- without eps,
# 0 * inf = NaN.  Upstream's norm kernels all take rsqrtf(sum / n + eps) over a float32 sum of
# squares, which holds these values (1e-10 is far above float32's smallest normal).
NEAR_ZERO = (1e-5, 1e-3)
EDGE_NEAR_ZERO = "rows near zero at ds4's eps 1e-6 (mean square 1e-10..1e-6) and an all-zero row"


def scaled_rows(rng, rows, n, lo=0.1, hi=10.0, near_zero=False):
    """Rows of Gaussian values, each row with its own scale over two decades, so a
    norm (or a sum) taken over the wrong row shows.  near_zero: every other row (the
    only one of a single row) at a scale in NEAR_ZERO, and of three or more rows the
    last all zero."""
    scale = np.exp(rng.uniform(np.log(lo), np.log(hi), (rows, 1)))
    if near_zero:
        tiny = np.arange(rows) % 2 == (0 if rows == 1 else 1)
        scale[tiny] = np.exp(rng.uniform(np.log(NEAR_ZERO[0]), np.log(NEAR_ZERO[1]), (int(tiny.sum()), 1)))
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    if near_zero and rows >= 3:
        x[-1] = 0.0
    return x


def norm_weight(rng, n):
    """A norm weight like a trained one: around 1, never 1 everywhere (a kernel that
    ignores it is off by tens of percent per element)."""
    return rng.uniform(0.25, 2.0, n).astype(np.float32)


def hc_params(rng):
    """The three HC scales (pre, post, combine) and the 24-value base, float32, as
    ds4's hc_*_scale / hc_*_base tensors hold them.  Distinct scales, so a kernel
    that uses the wrong one (or none) is off; a combine scale that makes the
    softmax rows uneven, so the Sinkhorn rounds have work to do."""
    scale = np.array([rng.uniform(0.5, 0.9), rng.uniform(1.2, 1.6), rng.uniform(1.8, 2.4)], np.float32)
    base = (rng.standard_normal(MIX) * 0.7).astype(np.float32)
    return scale, base


# The 16 combine values of every row shifted by +55 (times the combine scale 1.8..2.4: logits of
# 99..132): the row softmax of the Sinkhorn split is shift-invariant, but expf overflows float32 past
# 88.7 without the row maximum subtracted.  Upstream's hc4_split_one subtracts it.  A float32
# emulation of hc4_split_one (with and without FMA) on these rows stays under NMSE 4e-13 against the
# float64 reference (the spec's bound is 1e-11); without the maximum it returns NaN.
COMB_SHIFT = 55.0
EDGE_COMB_SHIFT = "combine logits shifted to ~100-130 (the split's softmax overflows expf without its max)"


def hc_mix(rng, rows, width=MIX, comb_shift=0.0):
    """HC control vectors (the fn projection of the normalised state): O(1); comb_shift added to the
    combine part (the last N_HC^2 values of each row)."""
    x = (rng.standard_normal((rows, width)) * 1.5).astype(np.float32)
    if comb_shift:
        x[:, 2 * N_HC:] += np.float32(comb_shift)
    return x


def f16_table(rng, n_vocab, n_embd):
    """An F16 embedding table of embedding-sized values (~0.05), with F16 subnormals
    (|x| < 6.1e-5) in every row, every 17th value: a decode that flushes them is off."""
    t = (rng.standard_normal((n_vocab, n_embd)) * 0.05).astype(np.float16)
    sub = t[:, ::17].shape
    t[:, ::17] = (rng.uniform(0.5, 1.0, sub) * 6e-5 * rng.choice([-1, 1], sub)).astype(np.float16)
    return t


def weight_map(rng, blobs, gap=96):
    """A model map of random bytes holding the float32/int32 blobs (offsets depend on
    the blob sizes only, so two seeds share one layout)."""
    return Context.synthetic_map([np.ascontiguousarray(b) for b in blobs], rng, gap=gap)


def past_end(m, nbytes):
    """An offset whose range of nbytes runs half past the end of the map."""
    return m.size - nbytes // 2
