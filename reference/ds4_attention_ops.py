"""numpy references for ds4's attention, KV-cache, compressor and indexer ops.

Companion of ``reference/ds4_ops.py`` (same conventions: one function per
``ds4_gpu_*_tensor`` call, same argument order, outputs returned, float64
arithmetic on float32 inputs unless a rounding step of ds4.c is emulated).
Written from the semantics of ds4's CPU path (``ds4.c``), never from a GPU
backend:

* FP8 KV round trip (``dsv4_fp8_kv_quantize_row_inplace_cpu``): the first
  head_dim - n_rot values of a row, in blocks of 64: scale = 2^ceil(log2(amax/448))
  (amax floored at 1e-4), each value -> nearest E4M3FN value of x/scale, ties to
  the even code, times scale.  The RoPE tail is left alone.
* indexer QAT (``dsv4_indexer_qat_row_inplace_cpu``): a 128-point Hadamard
  butterfly times 1/sqrt(128), then an FP4 (E2M1) round trip in blocks of 32:
  scale = 2^ceil(log2(amax/6)), nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties
  to the even code.  The butterfly is emulated in float32, in ds4.c's order,
  because the FP4 rounding that follows turns a last-bit difference into a
  whole FP4 step.
* the raw SWA cache holds rows rounded to f16 (ds4.c: fp8 round trip then
  ``f16_round_inplace_cpu``), in a ring of raw_cap rows: position p -> row p % raw_cap.
* attention (``layer_attention_mixed_one``, ``layer_attention_prefix_batch_worker``):
  one KV head shared by every query head, K = V = the cache row, scores
  q.kv / sqrt(head_dim), a per-head sink logit that joins the softmax's
  denominator and contributes no value, compressed rows appended after the
  raw ones, a compressed row masked out (mask -inf / not selected) dropped.
* indexer scores (``indexer_allowed_decode_one``): per compressed row c,
  sum_h relu(q_h . k_c) * w_h, times scale; with the causal rule a token at
  position p sees the first (p + 1) / ratio compressed rows.
* compressor (``compressor_decode_one``, ``compressor_pool_decode_state``):
  ratio-4 layers keep 2 x 4 state rows of width 2*head_dim (the previous
  window's first half overlaps the current window's second half); APE is
  added to the score at store time; a window is pooled by a per-dimension
  softmax over its rows' scores, RMS-normed with a weight, tail-RoPEd at the
  window's first position.

The GPU API draws its own boundaries around these steps (e.g. the FP8 round
trip of a compressed row is a separate call); each function says which steps
its call contains.  Errors the C call reports by returning 0 raise ValueError.
"""
from __future__ import annotations

import math

import numpy as np

from . import ds4_ops as base

N_HEAD = base.N_HEAD
HEAD_DIM = base.HEAD_DIM
N_ROT = base.N_ROT
N_SWA = 128                 # DS4_N_SWA: raw sliding-window rows
INDEXER_HEADS = 64          # DS4_N_INDEXER_HEAD
INDEXER_HEAD_DIM = 128      # DS4_N_INDEXER_HEAD_DIM
INDEXER_TOP_K = base.INDEXER_TOP_K
FP8_MAX = 448.0
FP8_BLOCK = 64
FP4_MAX = 6.0
FP4_BLOCK = 32
HADAMARD_SCALE = np.float32(0.08838834764831845)   # 1/sqrt(128) as ds4.c writes it

_f32 = base._f32


# ---------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------

def e4m3fn_table() -> np.ndarray:
    """The 127 non-negative finite E4M3FN values by code (code 127 is NaN)."""
    codes = np.arange(127)
    e, m = codes >> 3, codes & 7
    sub = m * 2.0 ** -9
    norm = (1.0 + m / 8.0) * np.exp2(e - 7.0)
    return np.where(e == 0, sub, norm).astype(np.float32)


_E4M3 = e4m3fn_table()
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _round_to_table(x, table: np.ndarray, vmax: float) -> np.ndarray:
    """Nearest table value of |x| (clamped to vmax), ties to the even code, sign kept."""
    x = np.asarray(x, np.float32)
    ax = np.minimum(np.abs(x), np.float32(vmax))
    mids = ((table[:-1].astype(np.float64) + table[1:]) / 2).astype(np.float32)  # exact for these tables
    idx = np.searchsorted(mids, ax, side="left")  # a value on a midpoint lands on the lower code ...
    tie = idx < mids.size
    tie[tie] = ax[tie] == mids[idx[tie]]
    idx[tie & (idx % 2 == 1)] += 1  # ... and moves up when that code is odd: ties go to the even code
    q = table[idx]
    return np.copysign(q, x).astype(np.float32)


def e4m3_round(x) -> np.ndarray:
    return _round_to_table(x, _E4M3, FP8_MAX)


def e2m1_round(x) -> np.ndarray:
    return _round_to_table(x, _E2M1, FP4_MAX)


def _pow2_block_scale(amax: np.ndarray, vmax: float, floor: float) -> np.ndarray:
    """2^ceil(log2(max(amax, floor) / vmax)), computed in float32 as ds4.c does."""
    a = np.maximum(amax.astype(np.float32), np.float32(floor))
    ratio = (a / np.float32(vmax)).astype(np.float32)
    return np.ldexp(np.float32(1.0), np.ceil(np.log2(ratio)).astype(np.int32)).astype(np.float32)


def f16_round(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------------------
# FP8 KV and indexer QAT (in place in the C API: the new contents are returned)
# ---------------------------------------------------------------------------

def dsv4_fp8_kv_quantize(x, n_tok: int, head_dim: int, n_rot: int) -> np.ndarray:
    """ds4_gpu_dsv4_fp8_kv_quantize_tensor: FP8 round trip of each row's first
    head_dim - n_rot values (blocks of 64); the tail and anything past n_tok rows unchanged."""
    if n_rot > head_dim:
        raise ValueError("n_rot > head_dim")
    n_nope = head_dim - n_rot
    if n_nope % FP8_BLOCK:
        # ds4.c always reads whole blocks of 64 (it would quantize into the RoPE
        # tail); the API leaves such sizes undefined, so the reference refuses them.
        raise ValueError(f"head_dim - n_rot = {n_nope} is not a multiple of {FP8_BLOCK}")
    a = np.array(x, np.float32).reshape(-1)
    rows = a[: n_tok * head_dim].reshape(n_tok, head_dim)
    nope = rows[:, :n_nope].reshape(n_tok, -1, FP8_BLOCK)
    scale = _pow2_block_scale(np.abs(nope).max(axis=2), FP8_MAX, 1e-4)[:, :, None]
    v = np.clip(nope / scale, -FP8_MAX, FP8_MAX)
    rows[:, :n_nope] = (e4m3_round(v) * scale).reshape(n_tok, n_nope)
    a[: n_tok * head_dim] = rows.reshape(-1)
    return a.reshape(np.shape(x))


def hadamard128_f32(rows: np.ndarray) -> np.ndarray:
    """ds4.c's butterfly (stride 1, 2, .., 64; a+b then a-b), in float32, times 1/sqrt(128)."""
    v = np.array(rows, np.float32).reshape(-1, 128)
    stride = 1
    while stride < 128:
        blk = v.reshape(v.shape[0], -1, 2, stride)
        a, b = blk[:, :, 0, :].copy(), blk[:, :, 1, :].copy()
        blk[:, :, 0, :] = a + b
        blk[:, :, 1, :] = a - b
        v = blk.reshape(v.shape[0], 128)
        stride <<= 1
    return (v * HADAMARD_SCALE).astype(np.float32)


def fp4_act_quantize(rows: np.ndarray) -> np.ndarray:
    """FP4 (E2M1) round trip in blocks of 32 (ds4.c dsv4_fp4_act_quantize_row_inplace_cpu)."""
    v = np.asarray(rows, np.float32)
    n_rows, n = v.shape
    blk = v.reshape(n_rows, n // FP4_BLOCK, FP4_BLOCK)
    scale = _pow2_block_scale(np.abs(blk).max(axis=2), FP4_MAX, 7.052966104933725e-38)[:, :, None]
    q = e2m1_round(np.clip(blk / scale, -FP4_MAX, FP4_MAX)) * scale
    return q.reshape(n_rows, n).astype(np.float32)


def dsv4_indexer_qat(x, n_rows: int, head_dim: int) -> np.ndarray:
    """ds4_gpu_dsv4_indexer_qat_tensor: Hadamard-128 then FP4 round trip, per row."""
    if head_dim != INDEXER_HEAD_DIM or n_rows == 0:
        raise ValueError("indexer QAT takes 128-wide rows, at least one")
    a = np.array(x, np.float32).reshape(-1)
    rows = a[: n_rows * head_dim].reshape(n_rows, head_dim)
    a[: n_rows * head_dim] = fp4_act_quantize(hadamard128_f32(rows)).reshape(-1)
    return a.reshape(np.shape(x))


# ---------------------------------------------------------------------------
# Raw KV cache
# ---------------------------------------------------------------------------

def store_raw_kv_batch(raw_cache, kv, raw_cap: int, pos0: int, n_tokens: int, head_dim: int) -> np.ndarray:
    """ds4_gpu_store_raw_kv_batch_tensor: kv row t, rounded to f16, into ring row (pos0 + t) % raw_cap."""
    if raw_cap == 0:
        raise ValueError("raw_cap == 0")
    cache = np.array(raw_cache, np.float32).reshape(-1)
    rows = np.asarray(kv, np.float32).reshape(-1)[: n_tokens * head_dim].reshape(n_tokens, head_dim)
    view = cache[: raw_cap * head_dim].reshape(raw_cap, head_dim)
    for t in range(n_tokens):  # in order: a batch longer than the ring keeps its last rows
        view[(pos0 + t) % raw_cap] = f16_round(rows[t])
    return cache.reshape(np.shape(raw_cache))


def store_raw_kv(raw_cache, kv, raw_cap: int, row: int, head_dim: int) -> np.ndarray:
    """ds4_gpu_store_raw_kv_tensor: one row (at ring row `row % raw_cap`)."""
    return store_raw_kv_batch(raw_cache, kv, raw_cap, row, 1, head_dim)


def kv_fp8_store_raw(kv, raw_cache, raw_cap: int, row: int, head_dim: int, n_rot: int):
    """ds4_gpu_kv_fp8_store_raw_tensor: FP8 round trip of kv in place, then store it: (kv, raw_cache)."""
    kq = dsv4_fp8_kv_quantize(kv, 1, head_dim, n_rot)
    return kq, store_raw_kv(raw_cache, kq, raw_cap, row, head_dim)


# ---------------------------------------------------------------------------
# Indexer scores
# ---------------------------------------------------------------------------

def indexer_scores(q, weights, index_comp, n_comp: int, n_tokens: int, pos0: int, n_head: int,
                   head_dim: int, ratio: int, scale: float, causal: bool) -> np.ndarray:
    """scores[t, c] = scale * sum_h relu(q[t, h] . k[c]) * w[t, h]; causal: c >= (pos0 + t + 1) // ratio -> -inf."""
    if n_comp == 0 or n_tokens == 0 or n_head == 0 or head_dim == 0 or (causal and ratio == 0):
        raise ValueError("empty indexer call or causal with ratio 0")
    qq = base._rows(q, n_tokens * n_head, head_dim).astype(np.float64).reshape(n_tokens, n_head, head_dim)
    w = base._rows(weights, n_tokens, n_head).astype(np.float64)
    k = base._rows(index_comp, n_comp, head_dim).astype(np.float64)
    s = np.empty((n_tokens, n_comp), np.float64)
    step = max(1, (1 << 25) // max(1, n_head * n_comp))  # tokens per slice: its dots stay near 256 MB
    for t0 in range(0, n_tokens, step):
        t1 = min(n_tokens, t0 + step)
        dots = np.maximum(qq[t0:t1].reshape(-1, head_dim) @ k.T, 0.0).reshape(t1 - t0, n_head, n_comp)
        s[t0:t1] = np.matmul(w[t0:t1, None, :], dots)[:, 0, :]
    s *= _f32(scale)
    if causal:
        visible = (pos0 + np.arange(n_tokens) + 1) // ratio
        s[np.arange(n_comp)[None, :] >= visible[:, None]] = -np.inf
    return s.astype(np.float32)


def indexer_score_one(q, weights, index_comp, n_comp: int, n_head: int, head_dim: int, scale: float):
    """ds4_gpu_indexer_score_one_tensor: one token, every compressed row visible."""
    return indexer_scores(q, weights, index_comp, n_comp, 1, 0, n_head, head_dim, 1, scale, False)


def indexer_scores_prefill(q, weights, index_comp, n_comp, n_tokens, n_head, head_dim, ratio, scale):
    """ds4_gpu_indexer_scores_prefill_tensor: tokens at positions 0.., causal."""
    return indexer_scores(q, weights, index_comp, n_comp, n_tokens, 0, n_head, head_dim, ratio, scale, True)


def indexer_scores_decode_batch(q, weights, index_comp, n_comp, n_tokens, pos0, n_head, head_dim, ratio, scale):
    """ds4_gpu_indexer_scores_decode_batch_tensor: tokens at positions pos0.., causal."""
    return indexer_scores(q, weights, index_comp, n_comp, n_tokens, pos0, n_head, head_dim, ratio, scale, True)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------

def _sinks(model_map, sinks_offset: int, n_head: int) -> np.ndarray:
    return base._weight_bytes(model_map, sinks_offset, 4 * n_head).view("<f4").astype(np.float64)


def _ring_rows(raw_kv, raw_cap, raw_start, head_dim):
    cache = base._rows(raw_kv, raw_cap, head_dim)
    return lambda logical: cache[(raw_start + np.asarray(logical, np.int64)) % raw_cap]


def attention_decode_batch(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, use_comp_mask, n_tokens,
                           pos0, n_raw, raw_cap, raw_start, n_comp, window, ratio, n_head, head_dim,
                           topk=None, top_k=0, chunk=32) -> np.ndarray:
    """Batched decode attention over a ring raw cache plus compressed rows.

    The raw cache holds the n_raw most recent positions, pos0 + n_tokens - n_raw
    .. pos0 + n_tokens - 1, logical row i at ring row (raw_start + i) % raw_cap.
    Token t (position p = pos0 + t) sees the raw positions in (p - window, p]
    (all when window == 0) and the first min(n_comp, (p + 1) // ratio) compressed
    rows -- every row when ratio == 0 and n_tokens == 1 (single-token decode) --
    filtered by comp_mask[t] (added; -inf drops) or by the selected top-k set.

    Tokens are taken `chunk` at a time: one score matrix against every row any
    of them sees, then a per-token bias (-inf where a row is not visible)."""
    if n_tokens == 0 or n_raw == 0 or raw_cap < n_raw or raw_start >= raw_cap:
        raise ValueError("bad raw-cache geometry")
    if n_comp and ratio == 0 and n_tokens != 1:
        raise ValueError("compressed rows need a ratio")
    sinks = _sinks(model_map, sinks_offset, n_head)
    q32 = base._rows(q, n_tokens * n_head, head_dim).reshape(n_tokens, n_head, head_dim)
    ring = _ring_rows(raw_kv, raw_cap, raw_start, head_dim)
    comp = base._rows(comp_kv, n_comp, head_dim).astype(np.float64) if n_comp else np.zeros((0, head_dim))
    mask = (np.asarray(comp_mask, np.float32).reshape(-1)[: n_tokens * n_comp].reshape(n_tokens, n_comp)
            if use_comp_mask and n_comp else None)
    sel = np.asarray(topk, np.int64).reshape(n_tokens, top_k) if topk is not None else None
    raw_all = ring(np.arange(n_raw)).astype(np.float64)
    first = pos0 + n_tokens - n_raw
    single = ratio == 0 and n_tokens == 1
    out = np.zeros((n_tokens, n_head, head_dim), np.float64)
    for t0 in range(0, n_tokens, chunk):
        ts = np.arange(t0, min(n_tokens, t0 + chunk))
        pos = pos0 + ts
        li = np.arange(n_raw)[None, :] + first  # position of each logical raw row
        if single:
            raw_ok = np.ones((ts.size, n_raw), bool)
            vis = np.full(ts.size, n_comp)
        else:
            raw_ok = (li <= pos[:, None]) & ((window == 0) | (li > pos[:, None] - window))
            vis = np.minimum(n_comp, (pos + 1) // ratio) if ratio else np.full(ts.size, n_comp)
        if sel is not None:
            seen = np.flatnonzero(raw_ok.any(axis=0))
            r0, r1 = (seen[0], seen[-1] + 1) if seen.size else (0, 0)
            out[ts] = _attend_selected(q32[ts], raw_all[r0:r1], np.where(raw_ok[:, r0:r1], 0.0, -np.inf), comp,
                                       sel[ts], vis, sinks, head_dim)
            continue
        comp_bias = np.where(np.arange(n_comp)[None, :] < vis[:, None], 0.0, -np.inf)
        if mask is not None:
            comp_bias = comp_bias + mask[ts].astype(np.float64)
        # only the raw rows some token of the chunk sees, and the compressed rows any may see
        seen = np.flatnonzero(raw_ok.any(axis=0))
        r0, r1 = (seen[0], seen[-1] + 1) if seen.size else (0, 0)
        c1 = int(vis.max()) if n_comp else 0
        rows = np.concatenate([raw_all[r0:r1], comp[:c1]])
        bias = np.concatenate([np.where(raw_ok[:, r0:r1], 0.0, -np.inf), comp_bias[:, :c1]], axis=1)
        # float32 products: q and cache rows are float32 data, and float32 BLAS keeps
        # the reference affordable (its error, ~1e-7 of a score, is far inside every bound)
        s = (q32[ts].reshape(-1, head_dim) @ rows.T.astype(np.float32)).astype(np.float64)
        s = s.reshape(ts.size, n_head, -1) / math.sqrt(head_dim)
        s += bias[:, None, :]
        m = np.maximum(s.max(axis=2, initial=-np.inf), sinks[None, :])
        w = np.exp(s - m[:, :, None])  # exp(-inf) = 0: rows not seen weigh nothing
        den = np.exp(sinks[None, :] - m) + w.sum(axis=2)
        pv = w.reshape(-1, rows.shape[0]).astype(np.float32) @ rows.astype(np.float32)  # 2-D: BLAS
        out[ts] = pv.reshape(ts.size, n_head, head_dim) / den[:, :, None]
    return out.astype(np.float32)


def _attend_selected(q32, raw, raw_bias, comp, sel, vis, sinks, head_dim):
    """attention_decode_batch's step for tokens with a top-k selection: each token against the chunk's raw
    rows and its own selected compressed rows only (a set: sorted, repeats, -1, rows past n_comp and rows
    not yet visible weigh nothing), gathered per token.  The same sums as masking a score matrix against
    every visible row, without computing the rows no token selected (at ds4's 2048-token prefill chunk over
    8192 rows, 13x fewer products)."""
    idx = np.sort(sel, axis=1)
    ok = (idx >= 0) & (idx < comp.shape[0]) & (idx < vis[:, None])
    ok[:, 1:] &= idx[:, 1:] != idx[:, :-1]
    g = comp.astype(np.float32)[np.where(ok, idx, 0)]  # (tokens, top_k, head_dim)
    n_tok, n_head = q32.shape[0], q32.shape[1]
    s_raw = (q32.reshape(-1, head_dim) @ raw.T.astype(np.float32)).reshape(n_tok, n_head, -1)
    s_sel = np.matmul(q32, g.transpose(0, 2, 1))  # (tokens, heads, top_k): one BLAS product per token
    s = np.concatenate([s_raw, s_sel], axis=2).astype(np.float64) / math.sqrt(head_dim)
    s += np.concatenate([raw_bias, np.where(ok, 0.0, -np.inf)], axis=1)[:, None, :]
    m = np.maximum(s.max(axis=2, initial=-np.inf), sinks[None, :])
    w = np.exp(s - m[:, :, None])
    den = np.exp(sinks[None, :] - m) + w.sum(axis=2)
    n_raw = raw.shape[0]
    w32 = w.astype(np.float32)
    pv = (w32[:, :, :n_raw].reshape(-1, n_raw) @ raw.astype(np.float32)).reshape(n_tok, n_head, head_dim)
    pv = pv + np.matmul(w32[:, :, n_raw:], g)
    return pv / den[:, :, None]


def attention_decode_heads(model_map, sinks_offset, q, raw_kv, n_raw, raw_cap, raw_start, comp_kv, n_comp,
                           comp_mask, use_mask, n_head, head_dim) -> np.ndarray:
    """ds4_gpu_attention_decode_heads_tensor: one token over all n_raw ring rows and all n_comp rows."""
    return attention_decode_batch(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, use_mask, 1, 0,
                                  n_raw, raw_cap, raw_start, n_comp, 0, 0, n_head, head_dim)[0]


def attention_decode_raw_batch_heads(model_map, sinks_offset, q, raw_kv, n_tokens, pos0, n_raw, raw_cap,
                                     raw_start, window, n_head, head_dim) -> np.ndarray:
    return attention_decode_batch(model_map, sinks_offset, q, raw_kv, None, None, 0, n_tokens, pos0, n_raw,
                                  raw_cap, raw_start, 0, window, 1, n_head, head_dim)


def attention_decode_mixed_batch_heads(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, use_comp_mask,
                                       n_tokens, pos0, n_raw, raw_cap, raw_start, n_comp, window, ratio,
                                       n_head, head_dim) -> np.ndarray:
    return attention_decode_batch(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, use_comp_mask,
                                  n_tokens, pos0, n_raw, raw_cap, raw_start, n_comp, window, ratio, n_head,
                                  head_dim)


def attention_indexed_mixed_batch_heads(model_map, sinks_offset, q, raw_kv, comp_kv, topk, n_tokens, pos0,
                                        n_raw, raw_cap, raw_start, n_comp, top_k, window, ratio, n_head,
                                        head_dim) -> np.ndarray:
    """Compressed rows = the token's top-k selection (as a set; -1 and rows not yet visible skipped)."""
    if n_comp == 0 or top_k == 0 or top_k > 512:
        raise ValueError("indexed attention needs 1..512 selected rows of a non-empty compressed cache")
    return attention_decode_batch(model_map, sinks_offset, q, raw_kv, comp_kv, None, 0, n_tokens, pos0, n_raw,
                                  raw_cap, raw_start, n_comp, window, ratio, n_head, head_dim,
                                  topk=topk, top_k=top_k)


def attention_prefill(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, n_tokens, n_comp, window,
                      ratio, n_head, head_dim) -> np.ndarray:
    """Fresh-prompt attention: raw_kv holds the n_tokens rows (no ring), token t sees rows
    (t - window, t] and the first min(n_comp, (t + 1) // ratio) compressed rows (mask added)."""
    if n_tokens == 0 or ratio == 0 or window > 256:
        raise ValueError("prefill attention needs tokens, a ratio and window <= 256")
    return attention_decode_batch(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask,
                                  comp_mask is not None, n_tokens, 0, n_tokens, n_tokens, 0, n_comp, window,
                                  ratio, n_head, head_dim)


def attention_prefill_raw_heads(model_map, sinks_offset, q, raw_kv, n_tokens, window, n_head, head_dim):
    return attention_prefill(model_map, sinks_offset, q, raw_kv, None, None, n_tokens, 0, window, 1, n_head,
                             head_dim)


def attention_prefill_static_mixed_heads(model_map, sinks_offset, q, raw_kv, comp_kv, n_tokens, n_comp, window,
                                         ratio, n_head, head_dim):
    return attention_prefill(model_map, sinks_offset, q, raw_kv, comp_kv, None, n_tokens, n_comp, window, ratio,
                             n_head, head_dim)


def attention_prefill_masked_mixed_heads(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, n_tokens, n_comp,
                                         window, ratio, n_head, head_dim):
    return attention_prefill(model_map, sinks_offset, q, raw_kv, comp_kv, comp_mask, n_tokens, n_comp, window,
                             ratio, n_head, head_dim)


# ---------------------------------------------------------------------------
# Compressor (ds4.c compressor_decode_one / compressor_pool_decode_state /
# compressor_finish_prefill_state_cpu)
# ---------------------------------------------------------------------------

APE_F32, APE_F16 = 0, 1


def _coff(ratio: int) -> int:
    return 2 if ratio == 4 else 1


def compressor_ape(model_map, ape_offset: int, ape_type: int, width: int, ratio: int) -> np.ndarray:
    """The APE table [ratio][width] (F32 or F16 in the map), as float32."""
    if ape_type not in (APE_F32, APE_F16):
        raise ValueError(f"ape_type {ape_type} is neither F32 (0) nor F16 (1)")
    dt, size = ("<f4", 4) if ape_type == APE_F32 else ("<f2", 2)
    raw = base._weight_bytes(model_map, ape_offset, size * width * ratio)
    return raw.view(dt).astype(np.float32).reshape(ratio, width)


def _store(state_kv, state_score, kv_row, sc_row, ape, pos, ratio):
    """One token into the state: row (ratio == 4 ? 4 : 0) + pos % ratio, score + APE[pos % ratio] (float32 add)."""
    pm = pos % ratio
    row = ratio + pm if ratio == 4 else pm
    state_kv[row] = kv_row
    state_score[row] = (sc_row.astype(np.float32) + ape[pm]).astype(np.float32)


def _pool(state_kv, state_score, head_dim, ratio) -> np.ndarray:
    """Per-dimension softmax over the window's rows: ratio 4 pairs the previous window's first
    half (rows 0..3, columns [0, D)) with the current window's second half (rows 4..7, [D, 2D))."""
    if ratio == 4:
        vals = np.concatenate([state_kv[:4, :head_dim], state_kv[4:8, head_dim:2 * head_dim]])
        scores = np.concatenate([state_score[:4, :head_dim], state_score[4:8, head_dim:2 * head_dim]])
    else:
        vals, scores = state_kv[:ratio, :head_dim], state_score[:ratio, :head_dim]
    vals, scores = vals.astype(np.float64), scores.astype(np.float64)
    m = scores.max(axis=0)
    out = np.zeros(head_dim)
    live = m > -np.inf  # ds4.c: a dimension with no finite score pools to 0
    w = np.exp(scores[:, live] - m[live])
    out[live] = (w * vals[:, live]).sum(axis=0) / w.sum(axis=0)
    return out


def _finish_row(pooled, norm_w, rms_eps, pos, n_rot, rope):
    """RMS norm with weight, then tail RoPE at the window's first position."""
    ss = float(np.dot(pooled, pooled))
    r = 1.0 / math.sqrt(ss / pooled.size + _f32(rms_eps))
    row = (pooled * r * norm_w).astype(np.float32)
    if n_rot:
        row = base.rope_tail(row, 1, 1, row.size, n_rot, pos, *rope).reshape(-1)
    return row


def _rope_args(n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    return (n_ctx_orig, False, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)


def _norm_weight(model_map, norm_offset, norm_type, head_dim):
    if norm_type != 0:
        raise ValueError("the compressor norm weight is F32 (norm_type 0)")
    return base._weight_bytes(model_map, norm_offset, 4 * head_dim).view("<f4").astype(np.float64)


def compressor_stream(state_kv, state_score, kv, sc, ape, norm_w, head_dim, ratio, pos0, n_tokens, n_rot, rope,
                      rms_eps):
    """ds4.c's streaming compressor over tokens pos0..: store each; on (pos + 1) % ratio == 0
    pool, norm, RoPE a row and (ratio 4) copy the current window into both halves.
    Returns (rows emitted [n][head_dim], state_kv, state_score)."""
    skv = np.array(state_kv, np.float32).reshape(_coff(ratio) * ratio, -1).copy()
    ssc = np.array(state_score, np.float32).reshape(_coff(ratio) * ratio, -1).copy()
    width = _coff(ratio) * head_dim
    kv = np.asarray(kv, np.float32).reshape(-1)[: n_tokens * width].reshape(n_tokens, width)
    sc = np.asarray(sc, np.float32).reshape(-1)[: n_tokens * width].reshape(n_tokens, width)
    rows = []
    for t in range(n_tokens):
        pos = pos0 + t
        _store(skv, ssc, kv[t], sc[t], ape, pos, ratio)
        if (pos + 1) % ratio:
            continue
        rows.append(_finish_row(_pool(skv, ssc, head_dim, ratio), norm_w, rms_eps, pos + 1 - ratio, n_rot, rope))
        if ratio == 4:
            skv[:4], ssc[:4] = skv[4:8], ssc[4:8]
    return np.array(rows, np.float32).reshape(-1, head_dim), skv, ssc


def _clear_after_prefill(skv, ssc, ratio, n_tokens):
    """compressor_finish_prefill_state_cpu: rows the next window has not written yet are cleared."""
    rem = n_tokens % ratio
    start, end = (ratio + rem, 2 * ratio) if ratio == 4 else (rem, ratio)
    skv[start:end] = 0.0
    ssc[start:end] = -np.inf


def compressor_store_batch(kv, sc, state_kv, state_score, model_map, ape_offset, ape_type, head_dim, ratio, pos0,
                           n_tokens):
    """ds4_gpu_compressor_store_batch_tensor: the store step for tokens pos0.. (no pooling).
    Returns (state_kv, state_score)."""
    if head_dim == 0 or ratio == 0 or n_tokens == 0:
        raise ValueError("empty store")
    width = _coff(ratio) * head_dim
    ape = compressor_ape(model_map, ape_offset, ape_type, width, ratio)
    skv = np.array(state_kv, np.float32).reshape(_coff(ratio) * ratio, width).copy()
    ssc = np.array(state_score, np.float32).reshape(_coff(ratio) * ratio, width).copy()
    kv = np.asarray(kv, np.float32).reshape(n_tokens, width)
    sc = np.asarray(sc, np.float32).reshape(n_tokens, width)
    for t in range(n_tokens):
        _store(skv, ssc, kv[t], sc[t], ape, pos0 + t, ratio)
    return skv, ssc


def compressor_update(kv_cur, sc_cur, state_kv, state_score, comp_cache, model_map, ape_offset, ape_type,
                      norm_offset, norm_type, head_dim, ratio, pos, comp_row, n_rot, n_ctx_orig, freq_base,
                      freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, rms_eps):
    """ds4_gpu_compressor_update_tensor: one streaming step at `pos`; a row emitted at the end of
    a window goes to comp_cache[comp_row] (normed and RoPE'd; its FP8 / QAT round trip is a
    separate call).  Returns (state_kv, state_score, comp_cache)."""
    if ratio == 0 or head_dim == 0:
        raise ValueError("empty compressor")
    width = _coff(ratio) * head_dim
    ape = compressor_ape(model_map, ape_offset, ape_type, width, ratio)
    norm_w = _norm_weight(model_map, norm_offset, 0, head_dim)
    rope = _rope_args(n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    rows, skv, ssc = compressor_stream(state_kv, state_score, kv_cur, sc_cur, ape, norm_w, head_dim, ratio, pos, 1,
                                       n_rot, rope, rms_eps)
    cache = np.array(comp_cache, np.float32).reshape(-1).copy()
    if rows.shape[0]:
        cache[comp_row * head_dim:(comp_row + 1) * head_dim] = rows[0]
    return skv, ssc, cache.reshape(np.shape(comp_cache))


def _prefill(comp_cache, state_kv, state_score, kv, sc, model_map, ape_offset, ape_type, norm_offset, norm_type,
             head_dim, ratio, pos0, n_tokens, n_rot, n_ctx_orig, quantize_fp8, rope_f, rms_eps, fresh):
    if head_dim == 0 or ratio == 0 or n_tokens == 0 or n_rot > head_dim or n_rot % 2:
        raise ValueError("bad compressor prefill sizes")
    width = _coff(ratio) * head_dim
    ape = compressor_ape(model_map, ape_offset, ape_type, width, ratio)
    norm_w = _norm_weight(model_map, norm_offset, norm_type, head_dim)
    rope = _rope_args(n_ctx_orig, *rope_f)
    n_state = _coff(ratio) * ratio
    if fresh:  # a fresh prompt: the compressor state starts empty (kv 0, score -inf)
        state_kv = np.zeros((n_state, width), np.float32)
        state_score = np.full((n_state, width), -np.inf, np.float32)
    rows, skv, ssc = compressor_stream(state_kv, state_score, kv, sc, ape, norm_w, head_dim, ratio, pos0, n_tokens,
                                       n_rot, rope, rms_eps)
    _clear_after_prefill(skv, ssc, ratio, n_tokens)
    if quantize_fp8 and rows.shape[0]:
        rows = dsv4_fp8_kv_quantize(rows, rows.shape[0], head_dim, n_rot)
    cache = np.array(comp_cache, np.float32).reshape(-1).copy()
    cache[: rows.size] = rows.reshape(-1)
    return cache.reshape(np.shape(comp_cache)), skv, ssc


def compressor_prefill(comp_cache, state_kv, state_score, kv, sc, model_map, ape_offset, ape_type, norm_offset,
                       norm_type, head_dim, ratio, pos0, n_tokens, n_rot, n_ctx_orig, quantize_fp8, freq_base,
                       freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, rms_eps):
    """ds4_gpu_compressor_prefill_tensor: a fresh prompt's n_tokens through the streaming
    compressor (from an empty state): rows 0..n_tokens/ratio - 1 of comp_cache, each optionally
    FP8 round-tripped, and the state a decode continues from.  Returns (comp_cache, state_kv, state_score)."""
    return _prefill(comp_cache, state_kv, state_score, kv, sc, model_map, ape_offset, ape_type, norm_offset,
                    norm_type, head_dim, ratio, pos0, n_tokens, n_rot, n_ctx_orig, quantize_fp8,
                    (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow), rms_eps, fresh=True)


def compressor_prefill_ratio4_replay(comp_cache, state_kv, state_score, kv, sc, model_map, ape_offset, ape_type,
                                     norm_offset, norm_type, head_dim, pos0, n_tokens, n_rot, n_ctx_orig,
                                     quantize_fp8, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
                                     beta_slow, rms_eps):
    """ds4_gpu_compressor_prefill_ratio4_replay_tensor: a ratio-4 prefill chunk that CONTINUES a
    prompt (pos0 and n_tokens multiples of 4): the first window's previous half is the given
    state's rows 0..3."""
    if n_tokens % 4 or pos0 % 4:
        raise ValueError("ratio-4 replay works on whole windows")
    return _prefill(comp_cache, state_kv, state_score, kv, sc, model_map, ape_offset, ape_type, norm_offset,
                    norm_type, head_dim, 4, pos0, n_tokens, n_rot, n_ctx_orig, quantize_fp8,
                    (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow), rms_eps, fresh=False)


def compressor_prefill_state_ratio4(state_kv, state_score, kv_tail, sc_tail, model_map, ape_offset, ape_type,
                                    head_dim, pos0):
    """ds4_gpu_compressor_prefill_state_ratio4_tensor: the ratio-4 state after a prefill that ends
    on a window boundary, from that last window's 4 tokens (positions pos0..pos0 + 3, pos0 a
    multiple of 4): as the streaming compressor leaves it -- the token at position p in row p % 4
    (score + APE of that phase), rows 4..7 empty.  Returns (state_kv, state_score)."""
    if head_dim == 0:
        raise ValueError("empty state")
    width = 2 * head_dim
    ape = compressor_ape(model_map, ape_offset, ape_type, width, 4)
    skv = np.zeros((8, width), np.float32)
    ssc = np.full((8, width), -np.inf, np.float32)
    kv = np.asarray(kv_tail, np.float32).reshape(-1)[: 4 * width].reshape(4, width)
    sc = np.asarray(sc_tail, np.float32).reshape(-1)[: 4 * width].reshape(4, width)
    for r in range(4):
        ph = (pos0 + r) % 4
        skv[ph] = kv[r]
        ssc[ph] = (sc[r] + ape[ph]).astype(np.float32)
    return skv, ssc
