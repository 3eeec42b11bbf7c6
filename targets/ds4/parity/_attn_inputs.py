"""Inputs shaped like ds4's own, shared by the attention / KV / compressor / indexer specs.

Loaded with porter.gates.parity.spec.sibling (a leading '_' keeps it from being read as a spec).

Why the inputs look the way they do:
* KV rows are what ds4 stores: the FP8 round trip of the non-RoPE part, then f16
  rounding (ds4.c does both before a row enters the raw cache).  f16 values are
  exact in TF32, so the cuBLAS attention paths (TF32 by default upstream) see
  exact keys.
* q rows are rounded to f16 for the same reason: the score GEMM is then exact
  up to float32 accumulation, and only the P.V product rounds to TF32.
* indexer q and compressed index rows go through the Hadamard + FP4 QAT, as in
  ds4: FP4 values times a power of two are exact in f16, which is what the
  tensor-core (WMMA) indexer paths convert them to.
* sinks are spread so that some heads are sink-dominated and some barely
  notice the sink: a kernel that ignores sinks, or adds one twice, moves many
  heads by a lot.
"""
import numpy as np

from porter.gates.parity.spec import Context
from reference import ds4_attention_ops as A

D = A.HEAD_DIM


def kv_rows(rng, n, head_dim=D, n_rot=A.N_ROT, scale=1.0):
    x = (rng.standard_normal((n, head_dim)) * scale).astype(np.float32)
    if (head_dim - n_rot) % A.FP8_BLOCK == 0 and n > 0:
        x = A.dsv4_fp8_kv_quantize(x, n, head_dim, n_rot)
    return A.f16_round(x)


def q_rows(rng, shape, scale=1.5):
    return A.f16_round(rng.standard_normal(shape) * scale)


def sinks(rng, n_head):
    return (rng.uniform(-2.0, 4.0, n_head)).astype(np.float32)


def sinks_map(rng, n_head):
    """(Map, sinks_offset, sinks): the per-head sink logits (F32) inside a random model map."""
    s = sinks(rng, n_head)
    m, (off,) = Context.synthetic_map([s], rng)
    return m, off, s


def qat_rows(rng, n, head_dim=A.INDEXER_HEAD_DIM):
    x = rng.standard_normal((n, head_dim)).astype(np.float32)
    return A.dsv4_indexer_qat(x, n, head_dim) if head_dim == A.INDEXER_HEAD_DIM else A.f16_round(x)


def ring_cache(rng, raw_cap, n_raw, raw_start, head_dim=D):
    """A raw SWA ring: n_raw live rows from ring row raw_start on (wrapping), stale rows elsewhere."""
    cache = kv_rows(rng, raw_cap, head_dim)
    return cache


# ---------------------------------------------------------------------------
# indexer scores (the three entry points differ in which scalars they take)
# ---------------------------------------------------------------------------

INDEXER_SCALE = float(np.float32(1.0 / np.sqrt(A.INDEXER_HEAD_DIM * A.INDEXER_HEADS)))


def indexer_inputs(rng, d):
    """q [n_tokens][n_head][head_dim] and index rows QAT'd as ds4 does (64 x 128), weights ~ N(0, 1).

    `short_rows`: index_comp holds one row fewer than n_comp (the call must refuse)."""
    n_tokens, n_head, hd, n_comp = d.get("n_tokens", 1), d["n_head"], d["head_dim"], d["n_comp"]
    q = qat_rows(rng, n_tokens * n_head, hd).reshape(n_tokens, n_head, hd)
    w = rng.standard_normal((n_tokens, n_head)).astype(np.float32)
    k = qat_rows(rng, n_comp - (1 if d.get("short_rows") else 0), hd)
    return q, w, k


def indexer_bytes(s):
    d = s.dims
    t = d.get("n_tokens", 1)
    return 4 * (t * d["n_head"] * d["head_dim"] + t * d["n_head"] + d["n_comp"] * d["head_dim"] + t * d["n_comp"])
