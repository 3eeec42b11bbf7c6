"""Shared inputs of the ds4 hc/norm/router parity specs (a helper, not a spec: the
leading '_' keeps load_specs from reading it as one).

Sizes are ds4's (ds4.c DS4_N_*): 4096-wide embedding, 4 hyper-connection streams
(hc state 16384 per token), a 24-value HC control vector per token (4 pre, 4
post, 4 x 4 combine), 20 Sinkhorn iterations, eps 1e-6, 64 heads x 512, q LoRA
1024, kv 512, 256 experts of which 6 are used, 43 layers, 129280 vocabulary rows.
"""
import numpy as np

from porter.gates.parity.spec import Context
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


def scaled_rows(rng, rows, n, lo=0.1, hi=10.0):
    """Rows of Gaussian values, each row with its own scale over two decades, so a
    norm (or a sum) taken over the wrong row shows."""
    scale = np.exp(rng.uniform(np.log(lo), np.log(hi), (rows, 1)))
    return (rng.standard_normal((rows, n)) * scale).astype(np.float32)


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


def hc_mix(rng, rows, width=MIX):
    """HC control vectors (the fn projection of the normalised state): O(1)."""
    return (rng.standard_normal((rows, width)) * 1.5).astype(np.float32)


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
