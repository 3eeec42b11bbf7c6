"""numpy references for every op of targets/minimoe/mini_gpu.h.

Each function mirrors one ``mini_gpu_*_tensor`` call: same argument order, with
the output tensors dropped (they are returned) and ``model_size`` dropped (it is
``len(model_map)``).  Activations come in as numpy arrays, weights as the raw
bytes of the model map at a byte offset, exactly as the backends read them.

Arithmetic is float64; results are float32 (int32 for expert ids), because the
engine stores every activation as float32 between ops.  Weight bytes are
decoded by gguf-py (``reference.quant.dequantize``); the quant formats are
cross-checked against our own decoder in tests/test_reference_quant.py.

Errors the header calls errors (token id or expert id out of range, a weight
range outside the map, a shape that is not a multiple of the block) raise
``ValueError``; a backend must return non-zero for them.
"""
from __future__ import annotations

import numpy as np

from . import quant
from .quant import QT


# ---------------------------------------------------------------------------
# Model-map access
# ---------------------------------------------------------------------------

def map_u8(model_map) -> np.ndarray:
    """The model map as a flat uint8 numpy array (no copy when possible)."""
    if isinstance(model_map, (bytes, bytearray, memoryview)):
        return np.frombuffer(model_map, dtype=np.uint8)
    a = np.asarray(model_map)
    if a.dtype != np.uint8 or a.ndim != 1:
        a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return a


def weight_bytes(model_map, offset: int, nbytes: int) -> np.ndarray:
    """Bytes [offset, offset+nbytes) of the map; ValueError when outside it."""
    m = map_u8(model_map)
    offset, nbytes = int(offset), int(nbytes)
    if offset < 0 or nbytes < 0 or offset + nbytes > m.size:
        raise ValueError(f"weight range [{offset}, {offset + nbytes}) is outside the model map ({m.size} bytes)")
    return m[offset:offset + nbytes]


def weight(model_map, offset: int, qtype, shape) -> np.ndarray:
    """Tensor of ``shape`` and ``qtype`` at ``offset``, dequantized by gguf-py (float32)."""
    return quant.dequantize(weight_bytes(model_map, offset, quant.tensor_bytes(qtype, shape)), qtype, shape)


def _rows(x, n_rows: int, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32).reshape(-1)
    if a.size < n_rows * n:
        raise ValueError(f"activation has {a.size} values, need {n_rows} x {n}")
    return a[: n_rows * n].astype(np.float64).reshape(n_rows, n)


# ---------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------

def embed_rows(tokens, model_map, weight_offset: int, n_vocab: int, n_embd: int, n_tokens: int) -> np.ndarray:
    """mini_gpu_embed_rows_tensor: out[t][:] = F16 row tokens[t] of the
    (n_vocab x n_embd) table at weight_offset, widened to float32.
    A token outside [0, n_vocab) is an error, not a clamp."""
    tok = np.asarray(tokens, dtype=np.int64).reshape(-1)[:n_tokens]
    if tok.size != n_tokens:
        raise ValueError("fewer tokens than n_tokens")
    if np.any(tok < 0) or np.any(tok >= n_vocab):
        raise ValueError(f"token id outside [0, {n_vocab}): {tok[(tok < 0) | (tok >= n_vocab)][:4]}")
    table = weight(model_map, weight_offset, QT.F16, (n_vocab, n_embd))
    return table[tok].astype(np.float32)


# ---------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------

def rms_norm_plain_rows(x, n: int, n_rows: int, eps: float) -> np.ndarray:
    """mini_gpu_rms_norm_plain_rows_tensor:
    out[r][i] = x[r][i] / sqrt(mean_i(x[r][i]^2) + eps)."""
    a = _rows(x, n_rows, n)
    eps = float(np.float32(eps))
    return (a / np.sqrt(np.mean(a * a, axis=1, keepdims=True) + eps)).astype(np.float32)


def rms_norm_weight_rows(x, model_map, weight_offset: int, n: int, n_rows: int, eps: float) -> np.ndarray:
    """mini_gpu_rms_norm_weight_rows_tensor: the plain norm times an F32
    weight vector of n values at weight_offset."""
    w = weight(model_map, weight_offset, QT.F32, (n,)).astype(np.float64)
    a = _rows(x, n_rows, n)
    eps = float(np.float32(eps))
    return (a / np.sqrt(np.mean(a * a, axis=1, keepdims=True) + eps) * w).astype(np.float32)


# ---------------------------------------------------------------------------
# Dense projections
# ---------------------------------------------------------------------------

def _matmul(qtype, model_map, weight_offset, in_dim, out_dim, x, n_tok) -> np.ndarray:
    in_dim, out_dim, n_tok = int(in_dim), int(out_dim), int(n_tok)
    raw = weight_bytes(model_map, weight_offset, quant.tensor_bytes(qtype, (out_dim, in_dim)))
    return quant.quant_matvec(raw, qtype, out_dim, in_dim, _rows(x, n_tok, in_dim)).astype(np.float32)


def matmul_q8_0(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """mini_gpu_matmul_q8_0_tensor: out[t][o] = sum_i W[o][i] * x[t][i], W Q8_0
    (blocks of 32: f16 d, 32 int8 q, value d*q); in_dim a multiple of 32."""
    return _matmul(QT.Q8_0, model_map, weight_offset, in_dim, out_dim, x, n_tok)


def matmul_f16(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """mini_gpu_matmul_f16_tensor: the same contract with W stored as F16."""
    return _matmul(QT.F16, model_map, weight_offset, in_dim, out_dim, x, n_tok)


def matmul_q4_k(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """mini_gpu_matmul_q4_k_tensor: the same contract with W in Q4_K (the
    abandoned variant; the engine never calls it)."""
    return _matmul(QT.Q4_K, model_map, weight_offset, in_dim, out_dim, x, n_tok)


# ---------------------------------------------------------------------------
# Positional encoding
# ---------------------------------------------------------------------------

def rope_tail(x, n_tokens: int, n_head: int, head_dim: int, n_rot: int, pos0: int, freq_base: float) -> np.ndarray:
    """mini_gpu_rope_tail_tensor (in place there; a new array here).

    Only the last n_rot dims of each head rotate; pairs (x[2j], x[2j+1]) are
    adjacent inside that tail; token t is at position pos0+t and
    theta_j = (pos0+t) * freq_base^(-2j/n_rot).  The rotation is the usual
    (ggml "normal" mode) one:
        x0' = x0 cos(theta) - x1 sin(theta),  x1' = x0 sin(theta) + x1 cos(theta)."""
    if n_rot % 2 or n_rot > head_dim:
        raise ValueError("n_rot must be even and <= head_dim")
    a = _rows(x, n_tokens * n_head, head_dim).reshape(n_tokens, n_head, head_dim).copy()
    if n_rot == 0:
        return a.astype(np.float32)
    pos = (int(pos0) + np.arange(n_tokens, dtype=np.float64))[:, None]
    j = np.arange(n_rot // 2, dtype=np.float64)[None, :]
    theta = pos * np.power(float(np.float32(freq_base)), -2.0 * j / n_rot)     # (n_tokens, n_rot/2)
    c = np.cos(theta)[:, None, :]
    s = np.sin(theta)[:, None, :]
    tail = a[:, :, head_dim - n_rot:]
    x0 = tail[..., 0::2].copy()
    x1 = tail[..., 1::2].copy()
    tail[..., 0::2] = x0 * c - x1 * s
    tail[..., 1::2] = x0 * s + x1 * c
    return a.astype(np.float32)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------

def attention_window(q, k_cache, v_cache, model_map, sinks_offset: int, n_tokens: int, pos0: int,
                     n_head: int, head_dim: int, window: int, scale: float) -> np.ndarray:
    """mini_gpu_attention_window_tensor: causal sliding-window attention, one
    shared KV head, per-head sink logit.  Output n_tokens x n_head x head_dim.

    Query t sits at p = pos0+t and sees keys max(0, p-window+1) .. p:
        s_j = scale * dot(q, k_j);  m = max(max_j s_j, sink_h)
        out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
    The sink takes probability mass but contributes no value."""
    n_pos = int(pos0) + int(n_tokens)
    qa = _rows(q, n_tokens * n_head, head_dim).reshape(n_tokens, n_head, head_dim)
    ka = _rows(k_cache, n_pos, head_dim)
    va = _rows(v_cache, n_pos, head_dim)
    sinks = weight(model_map, sinks_offset, QT.F32, (n_head,)).astype(np.float64)
    scale = float(np.float32(scale))
    out = np.zeros((n_tokens, n_head, head_dim))
    for t in range(n_tokens):
        p = int(pos0) + t
        lo = max(0, p - int(window) + 1)
        k = ka[lo:p + 1]
        v = va[lo:p + 1]
        s = scale * (qa[t] @ k.T)                                 # (n_head, n_keys)
        m = np.maximum(s.max(axis=1, initial=-np.inf), sinks)     # (n_head,)
        e = np.exp(s - m[:, None])
        denom = e.sum(axis=1) + np.exp(sinks - m)
        out[t] = (e @ v) / denom[:, None]
    return out.astype(np.float32)


# ---------------------------------------------------------------------------
# Mixture of experts
# ---------------------------------------------------------------------------

def router_topk(logits, n_expert: int, n_tokens: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """mini_gpu_router_topk_tensor: p = softmax(logits[t]); the top_k experts
    by p, descending, ties to the lower expert index; weights p / sum of the
    chosen p.  Returns (expert_ids int32 [n_tokens][top_k],
    expert_weights float32 [n_tokens][top_k])."""
    if not 0 < top_k <= n_expert:
        raise ValueError("top_k must be in 1..n_expert")
    lg = _rows(logits, n_tokens, n_expert)
    e = np.exp(lg - lg.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    ids = np.empty((n_tokens, top_k), dtype=np.int32)
    w = np.empty((n_tokens, top_k), dtype=np.float32)
    for t in range(n_tokens):
        # stable sort on -p keeps equal p in ascending index order
        order = np.argsort(-p[t], kind="stable")[:top_k]
        ids[t] = order
        w[t] = p[t, order] / p[t, order].sum()
    return ids, w


def _expert_ids(expert_ids, n_tokens: int, top_k: int, n_expert: int) -> np.ndarray:
    ids = np.asarray(expert_ids, dtype=np.int64).reshape(-1)[: n_tokens * top_k].reshape(n_tokens, top_k)
    if np.any(ids < 0) or np.any(ids >= n_expert):
        raise ValueError(f"expert id outside [0, {n_expert})")
    return ids


def routed_gate_up_iq2_xxs(model_map, gate_offset: int, up_offset: int, n_embd: int, n_ff: int,
                           n_expert: int, x, expert_ids, n_tokens: int, top_k: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """mini_gpu_routed_gate_up_iq2_xxs_tensor: gate/up weights are
    [n_expert][n_ff][n_embd] IQ2_XXS (expert e at e*n_ff*(n_embd/256)*66 bytes);
    gate[t][k] = Wgate_e x[t], up[t][k] = Wup_e x[t] with e = expert_ids[t][k].
    Returns (gate, up), each float32 [n_tokens][top_k][n_ff]."""
    if n_embd % 256:
        raise ValueError("n_embd must be a multiple of 256")
    ids = _expert_ids(expert_ids, n_tokens, top_k, n_expert)
    xa = _rows(x, n_tokens, n_embd)
    shape = (n_expert, n_ff, n_embd)
    wg = weight(model_map, gate_offset, QT.IQ2_XXS, shape).astype(np.float64)
    wu = weight(model_map, up_offset, QT.IQ2_XXS, shape).astype(np.float64)
    gate = np.einsum("tkfi,ti->tkf", wg[ids], xa)
    up = np.einsum("tkfi,ti->tkf", wu[ids], xa)
    return gate.astype(np.float32), up.astype(np.float32)


def routed_down_q2_k(model_map, down_offset: int, n_ff: int, n_embd: int, n_expert: int, mid,
                     expert_ids, expert_weights, n_tokens: int, top_k: int) -> np.ndarray:
    """mini_gpu_routed_down_q2_k_tensor: down weights [n_expert][n_embd][n_ff]
    Q2_K; out[t] = sum_k expert_weights[t][k] * Wdown_{expert_ids[t][k]} mid[t][k].
    Returns float32 [n_tokens][n_embd]."""
    if n_ff % 256:
        raise ValueError("n_ff must be a multiple of 256")
    ids = _expert_ids(expert_ids, n_tokens, top_k, n_expert)
    m = _rows(mid, n_tokens * top_k, n_ff).reshape(n_tokens, top_k, n_ff)
    w = _rows(expert_weights, n_tokens, top_k)
    wd = weight(model_map, down_offset, QT.Q2_K, (n_expert, n_embd, n_ff)).astype(np.float64)
    y = np.einsum("tkef,tkf->tke", wd[ids], m)
    return np.einsum("tk,tke->te", w, y).astype(np.float32)


# ---------------------------------------------------------------------------
# Elementwise and diagnostics
# ---------------------------------------------------------------------------

def _flat(a, n: int) -> np.ndarray:
    v = np.asarray(a, dtype=np.float32).reshape(-1)
    if v.size < n:
        raise ValueError(f"need {n} values, got {v.size}")
    return v[:n].astype(np.float64)


def swiglu(gate, up, n: int) -> np.ndarray:
    """mini_gpu_swiglu_tensor: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g))."""
    g = _flat(gate, n)
    with np.errstate(over="ignore"):
        return (g / (1.0 + np.exp(-g)) * _flat(up, n)).astype(np.float32)


def add(a, b, n: int) -> np.ndarray:
    """mini_gpu_add_tensor: out[i] = a[i] + b[i] (out may alias a)."""
    return (_flat(a, n) + _flat(b, n)).astype(np.float32)


def debug_checksum(x, n: int) -> np.ndarray:
    """mini_gpu_debug_checksum_tensor: [sum of x[0..n), sum of squares] as float32."""
    v = _flat(x, n)
    return np.array([v.sum(), (v * v).sum()], dtype=np.float32)
