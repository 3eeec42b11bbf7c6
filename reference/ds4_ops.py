"""numpy references for the ds4 (DeepSeek V4 Flash) ops the parity gate calibrates.

One function per ``ds4_gpu_*_tensor`` call of ds4's ``ds4_gpu.h``, written from
the *semantics* of ds4's own CPU path (``ds4.c``, the engine's reference
implementation), never from a GPU backend's code.  Same argument order as the C
call, output tensors dropped (they are returned) and ``model_size`` dropped
(it is ``len(model_map)``).

Arithmetic is float64 on float32 inputs; results are float32 (int32 for
indices), because ds4 keeps every activation in float32 between ops.

Where ds4.c *quantizes activations* before a quantized dot product, so do we,
bit for bit in float32 (the engine's numbers include that rounding):

* Q8_0 projections: each row of x is cut into blocks of 32, d = amax/127,
  q = lrintf(x / d) in [-128, 127] (a partial last block is zero-padded), and
  the dot product is sum_b d_w[b] * d_x[b] * (q_w . q_x).
* routed experts (IQ2_XXS gate/up, Q2_K down): x and the SwiGLU'd mid are
  quantized to Q8_K (blocks of 256, the element of largest magnitude ``max``,
  iscale = -127/max, q = lrintf(iscale * x) clamped to [-128, 127],
  d = 1/iscale).

Weight bytes are decoded by gguf-py through ``reference.quant.dequantize``; the
tests cross-check every op here against a second formulation (our own block
decoder, scalar loops, complex rotations, repeated argmax).

Errors the C call reports by returning 0 raise ``ValueError`` here.
"""
from __future__ import annotations

import math

import numpy as np

from . import quant
from .quant import QT

QK_K = 256

# ds4 model constants the specs use (ds4.c: DS4_N_*).
N_EMBD = 4096
N_HEAD = 64
HEAD_DIM = 512
N_ROT = 64
N_HC = 4
N_EXPERT = 256            # routed experts per layer: the expert tensors hold 256 of them
N_EXPERT_USED = 6
N_FF_EXP = 2048
INDEXER_TOP_K = 512
RMS_EPS = 1e-6
SWIGLU_CLAMP = 10.0
ROPE_FREQ_BASE = 10000.0
COMPRESS_ROPE_FREQ_BASE = 160000.0
ROPE_SCALE_FACTOR = 16.0
ROPE_YARN_BETA_FAST = 32.0
ROPE_YARN_BETA_SLOW = 1.0
ROPE_ORIG_CTX = 65536

# GGML type numbers as ds4's routed-expert call takes them (gate_type, down_type).
GGML_TYPE = {"Q8_0": 8, "Q2_K": 10, "Q4_K": 12, "IQ2_XXS": 16}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

def _f32(v) -> float:
    """A scalar as the C call sees it (float parameters are float32)."""
    return float(np.float32(v))


def _rows(x, n_rows: int, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32).reshape(-1)
    if a.size < n_rows * n:
        raise ValueError(f"activation has {a.size} values, need {n_rows} x {n}")
    return a[: n_rows * n].reshape(n_rows, n)


def _map(model_map) -> np.ndarray:
    if isinstance(model_map, (bytes, bytearray, memoryview)):
        return np.frombuffer(model_map, dtype=np.uint8)
    a = np.asarray(model_map)
    return a if (a.dtype == np.uint8 and a.ndim == 1) else np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _weight_bytes(model_map, offset: int, nbytes: int) -> np.ndarray:
    m = _map(model_map)
    offset, nbytes = int(offset), int(nbytes)
    if offset < 0 or nbytes < 0 or offset + nbytes > m.size:
        raise ValueError(f"weight range [{offset}, {offset + nbytes}) is outside the model map ({m.size} bytes)")
    return m[offset:offset + nbytes]


# ---------------------------------------------------------------------------
# Norms and elementwise ops
# ---------------------------------------------------------------------------

def rms_norm_plain_rows(x, n: int, rows: int, eps: float) -> np.ndarray:
    """ds4_gpu_rms_norm_plain_rows_tensor: out[r] = x[r] / sqrt(mean(x[r]^2) + eps),
    no weight (ds4 uses it on the flattened hyper-connection state, 4 x 4096)."""
    a = _rows(x, rows, n).astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(a * a, axis=1, keepdims=True) + _f32(eps))
    return (a * scale).astype(np.float32)


def swiglu(gate, up, n: int, clamp: float, weight: float) -> np.ndarray:
    """ds4_gpu_swiglu_tensor: out = silu(g) * u * weight, where with clamp > 1e-6
    (ds4.c swiglu(), DS4_SWIGLU_CLAMP_EXP = 10) g = min(gate, clamp) and
    u = clip(up, -clamp, clamp) first; clamp <= 1e-6 means no clamping."""
    g = np.asarray(gate, dtype=np.float32).reshape(-1)[:n].astype(np.float64)
    u = np.asarray(up, dtype=np.float32).reshape(-1)[:n].astype(np.float64)
    c = _f32(clamp)
    if c > _f32(1e-6):
        g = np.minimum(g, c)
        u = np.clip(u, -c, c)
    with np.errstate(over="ignore"):
        silu = g / (1.0 + np.exp(-g))
    return (silu * u * _f32(weight)).astype(np.float32)


# ---------------------------------------------------------------------------
# Activation quantization (as ds4.c does it before quantized dot products)
# ---------------------------------------------------------------------------

def quantize_q8_0_activation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of float32 x (rows, n) -> (q int8 (rows, blocks*32), d float32 (rows, blocks)).

    Per block of 32: d = amax/127 (float32), id = 1/d (0 when d == 0),
    q = lrintf(x * id) clamped to [-128, 127]; padding of a partial last block is 0."""
    x = np.asarray(x, dtype=np.float32)
    rows, n = x.shape
    blocks = (n + 31) // 32
    xp = np.zeros((rows, blocks * 32), dtype=np.float32)
    xp[:, :n] = x
    xb = xp.reshape(rows, blocks, 32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    prod_ = (xb * idv[:, :, None]).astype(np.float32)
    q = np.clip(np.rint(prod_), -128, 127).astype(np.int8)  # rint: round half to even, as lrintf
    q = q.reshape(rows, blocks * 32)
    q[:, n:] = 0
    return q, d


def quantize_q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of float32 x (rows, n), n a multiple of 256 -> (q int8 (rows, n), d float32 (rows, n/256)).

    Per block of 256: ``max`` is the value of largest magnitude (the first one on
    ties), iscale = -127/max, q = lrintf(iscale * x) clamped to [-128, 127],
    d = 1/iscale (float32 throughout); an all-zero block has d = 0, q = 0."""
    x = np.asarray(x, dtype=np.float32)
    rows, n = x.shape
    if n % QK_K:
        raise ValueError(f"Q8_K needs a multiple of {QK_K} values, got {n}")
    xb = x.reshape(rows, n // QK_K, QK_K)
    idx = np.argmax(np.abs(xb), axis=2)
    mx = np.take_along_axis(xb, idx[:, :, None], axis=2)[:, :, 0]
    zero = mx == 0
    safe = np.where(zero, np.float32(1.0), mx).astype(np.float32)
    iscale = (np.float32(-127.0) / safe).astype(np.float32)
    q = np.clip(np.rint((iscale[:, :, None] * xb).astype(np.float32)), -128, 127).astype(np.int8)
    q[zero] = 0
    d = np.where(zero, np.float32(0.0), (np.float32(1.0) / iscale).astype(np.float32)).astype(np.float32)
    return q.reshape(rows, n), d


def _dequant_activation(q: np.ndarray, d: np.ndarray, block: int) -> np.ndarray:
    rows, n = q.shape
    return (q.reshape(rows, n // block, block).astype(np.float64) * d.astype(np.float64)[:, :, None]).reshape(rows, n)


# ---------------------------------------------------------------------------
# Dense Q8_0 projection
# ---------------------------------------------------------------------------

def q8_0_row_bytes(in_dim: int) -> int:
    """Bytes of one Q8_0 weight row: ceil(in_dim/32) blocks of 34 (a partial last block is stored whole)."""
    return (int(in_dim) + 31) // 32 * 34


def matmul_q8_0(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """ds4_gpu_matmul_q8_0_tensor: out[t][o] = sum_i W[o][i] * x[t][i], W Q8_0 rows of
    ceil(in_dim/32) blocks at weight_offset, with x quantized to Q8_0 per block
    of 32 as ds4.c's matvec does (see the module docstring)."""
    in_dim, out_dim, n_tok = int(in_dim), int(out_dim), int(n_tok)
    blocks = (in_dim + 31) // 32
    raw = _weight_bytes(model_map, weight_offset, out_dim * blocks * 34)
    w = quant.dequantize(raw, QT.Q8_0, (out_dim, blocks * 32)).astype(np.float64)
    q, d = quantize_q8_0_activation(_rows(x, n_tok, in_dim))
    xd = _dequant_activation(q, d, 32)
    return (xd @ w.T).astype(np.float32)


def matmul_q8_0_unquantized(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """The same projection with x left in float (what an F16/F32-activation kernel
    computes); only used to bound how far such a kernel may sit from ``matmul_q8_0``."""
    in_dim, out_dim, n_tok = int(in_dim), int(out_dim), int(n_tok)
    blocks = (in_dim + 31) // 32
    raw = _weight_bytes(model_map, weight_offset, out_dim * blocks * 34)
    w = quant.dequantize(raw, QT.Q8_0, (out_dim, blocks * 32))[:, :in_dim].astype(np.float64)
    return (_rows(x, n_tok, in_dim).astype(np.float64) @ w.T).astype(np.float32)


# ---------------------------------------------------------------------------
# Tail RoPE (with YaRN), in place in the C call
# ---------------------------------------------------------------------------

def rope_yarn_corr_dims(n_rot: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """YaRN's [low, high] pair indices (ggml's rope_yarn_corr_dims, n_dims = n_rot)."""
    def corr(beta):
        return n_rot * math.log(n_ctx_orig / (beta * 2.0 * math.pi)) / (2.0 * math.log(freq_base))

    lo = max(0.0, math.floor(corr(beta_fast)))
    hi = min(float(n_rot - 1), math.ceil(corr(beta_slow)))
    return lo, hi


def rope_tail(x, n_tok: int, n_head: int, head_dim: int, n_rot: int, pos0: int, n_ctx_orig: int,
              inverse: bool, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
              beta_fast: float, beta_slow: float) -> np.ndarray:
    """ds4_gpu_rope_tail_tensor (ds4.c rope_tail_ext_inplace), returned as a new array.

    x is [n_tok][n_head][head_dim]; only the last n_rot values of each head
    rotate, in ADJACENT pairs (tail[2j], tail[2j+1]); token t sits at position
    pos0 + t.  With p = 2j (the pair's first index):
        theta_extrap = pos * freq_base^(-p/n_rot),  theta_interp = freq_scale * theta_extrap
        ext_factor == 0:  theta = theta_interp, mscale = attn_factor
        ext_factor != 0:  ramp = 1 - clip((j - low) / max(0.001, high - low), 0, 1)   (YaRN)
                          theta = theta_interp (1 - ramp ext) + theta_extrap ramp ext
                          mscale = attn_factor (1 + 0.1 ln(1/freq_scale))
        c = cos(theta) mscale, s = sin(theta) mscale (s negated when inverse)
        x0' = x0 c - x1 s,  x1' = x0 s + x1 c
    n_rot must be even and <= head_dim (else the call fails)."""
    n_tok, n_head, head_dim, n_rot = int(n_tok), int(n_head), int(head_dim), int(n_rot)
    if n_rot % 2 or n_rot > head_dim:
        raise ValueError("n_rot must be even and <= head_dim")
    a = _rows(x, n_tok * n_head, head_dim).astype(np.float64).reshape(n_tok, n_head, head_dim)
    if n_rot == 0:
        return a.astype(np.float32)
    freq_base, freq_scale = _f32(freq_base), _f32(freq_scale)
    ext_factor, attn_factor = _f32(ext_factor), _f32(attn_factor)
    j = np.arange(n_rot // 2, dtype=np.float64)
    pos = (int(pos0) + np.arange(n_tok, dtype=np.float64))[:, None]
    theta_extrap = pos * np.power(freq_base, -(2.0 * j) / n_rot)[None, :]
    theta_interp = freq_scale * theta_extrap
    if ext_factor != 0.0:
        lo, hi = rope_yarn_corr_dims(n_rot, int(n_ctx_orig), freq_base, _f32(beta_fast), _f32(beta_slow))
        ramp = 1.0 - np.clip((j - lo) / max(0.001, hi - lo), 0.0, 1.0)
        mix = ramp * ext_factor
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix
        mscale = attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    else:
        theta = theta_interp
        mscale = attn_factor
    c = (np.cos(theta) * mscale)[:, None, :]
    s = (np.sin(theta) * mscale * (-1.0 if inverse else 1.0))[:, None, :]
    tail = a[:, :, head_dim - n_rot:]
    x0 = tail[..., 0::2].copy()
    x1 = tail[..., 1::2].copy()
    tail[..., 0::2] = x0 * c - x1 * s
    tail[..., 1::2] = x0 * s + x1 * c
    return a.astype(np.float32)


# ---------------------------------------------------------------------------
# Indexer top-k
# ---------------------------------------------------------------------------

def indexer_topk(scores, n_comp: int, n_tokens: int, top_k: int) -> np.ndarray:
    """ds4_gpu_indexer_topk_tensor: per token row of n_comp scores, the indices of
    the top_k largest, in descending score order; equal scores rank the lower
    index first (ds4.c picks the next best with a strict '>' scan from index 0).
    top_k must be in [1, n_comp] (else the call fails)."""
    n_comp, n_tokens, top_k = int(n_comp), int(n_tokens), int(top_k)
    if n_comp == 0 or n_tokens == 0 or top_k == 0 or top_k > n_comp:
        raise ValueError("need 1 <= top_k <= n_comp and n_tokens >= 1")
    s = _rows(scores, n_tokens, n_comp)
    out = np.empty((n_tokens, top_k), dtype=np.int32)
    idx = np.arange(n_comp)
    for t in range(n_tokens):
        order = np.lexsort((idx, -s[t].astype(np.float64)))  # primary: score desc, then index asc
        out[t] = order[:top_k]
    return out


# ---------------------------------------------------------------------------
# Routed experts (one token): IQ2_XXS gate/up, Q2_K down
# ---------------------------------------------------------------------------

def routed_moe_one(model_map, gate_offset: int, up_offset: int, down_offset: int, gate_type: int,
                   down_type: int, gate_expert_bytes: int, gate_row_bytes: int, down_expert_bytes: int,
                   down_row_bytes: int, expert_in_dim: int, expert_mid_dim: int, out_dim: int,
                   selected, weights, n_expert: int, clamp: float, x) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_routed_moe_one_tensor for one token -> (out [out_dim], mid [n_expert][mid_dim]).

    n_expert is the number of routed slots (ds4: 6).  For slot k, expert
    e = selected[k] (a negative id reads expert 0): its gate and up matrices
    ([mid_dim][in_dim], gate_type = IQ2_XXS) start at
    gate_offset/up_offset + e * gate_expert_bytes with rows gate_row_bytes apart,
    its down matrix ([out_dim][mid_dim], down_type = Q2_K) at
    down_offset + e * down_expert_bytes with rows down_row_bytes apart.
        xq      = Q8_K(x)
        g, u    = W_gate[e] xq, W_up[e] xq       (clamp > 1e-6: g = min(g, c), u = clip(u, -c, c))
        mid[k]  = silu(g) * u * weights[k]
        out     = sum_k W_down[e] Q8_K(mid[k])
    The expert tensors hold N_EXPERT = 256 experts: the call fails when they do
    not fit the map, when in_dim or mid_dim is not a multiple of 256, or for any
    type pair other than (IQ2_XXS, Q2_K) (Q4_K/Q4_K is another path, not modelled)."""
    in_dim, mid_dim, out_dim, n_expert = int(expert_in_dim), int(expert_mid_dim), int(out_dim), int(n_expert)
    if (int(gate_type), int(down_type)) != (GGML_TYPE["IQ2_XXS"], GGML_TYPE["Q2_K"]):
        raise ValueError(f"type pair ({gate_type}, {down_type}) is not (IQ2_XXS, Q2_K)")
    if n_expert == 0 or in_dim % QK_K or mid_dim % QK_K:
        raise ValueError("in_dim and mid_dim must be multiples of 256, n_expert >= 1")
    m = _map(model_map)
    for name, off, per in (("gate", gate_offset, gate_expert_bytes), ("up", up_offset, gate_expert_bytes),
                           ("down", down_offset, down_expert_bytes)):
        if int(off) > m.size or N_EXPERT * int(per) > m.size - int(off):
            raise ValueError(f"{name} experts (256 x {per} bytes at {off}) do not fit the map ({m.size} bytes)")
    ids = np.asarray(selected, dtype=np.int32).reshape(-1)[:n_expert]
    wts = np.asarray(weights, dtype=np.float32).reshape(-1)[:n_expert].astype(np.float64)
    xq, xd = quantize_q8_K(_rows(x, 1, in_dim))
    xv = _dequant_activation(xq, xd, QK_K)[0]
    c = _f32(clamp)
    mid = np.zeros((n_expert, mid_dim), dtype=np.float32)
    out = np.zeros(out_dim, dtype=np.float64)
    g_rb = quant.row_bytes(QT.IQ2_XXS, in_dim)
    d_rb = quant.row_bytes(QT.Q2_K, mid_dim)
    for k in range(n_expert):
        e = max(int(ids[k]), 0)
        gw = _expert_matrix(m, int(gate_offset) + e * int(gate_expert_bytes), int(gate_row_bytes), g_rb, mid_dim,
                            QT.IQ2_XXS, in_dim)
        uw = _expert_matrix(m, int(up_offset) + e * int(gate_expert_bytes), int(gate_row_bytes), g_rb, mid_dim,
                            QT.IQ2_XXS, in_dim)
        g = gw @ xv
        u = uw @ xv
        if c > _f32(1e-6):
            g = np.minimum(g, c)
            u = np.clip(u, -c, c)
        with np.errstate(over="ignore"):
            mid[k] = (g / (1.0 + np.exp(-g)) * u * wts[k]).astype(np.float32)
        dw = _expert_matrix(m, int(down_offset) + e * int(down_expert_bytes), int(down_row_bytes), d_rb, out_dim,
                            QT.Q2_K, mid_dim)
        mq, md = quantize_q8_K(mid[k][None, :])
        out += dw @ _dequant_activation(mq, md, QK_K)[0]
    return out.astype(np.float32), mid


def _expert_matrix(m: np.ndarray, offset: int, row_stride: int, row_bytes: int, rows: int, qt, cols: int) -> np.ndarray:
    """rows x cols weights whose rows start row_stride bytes apart (float64)."""
    if row_stride == row_bytes:
        raw = _weight_bytes(m, offset, rows * row_bytes)
    else:
        raw = np.concatenate([_weight_bytes(m, offset + r * row_stride, row_bytes) for r in range(rows)])
    return quant.dequantize(raw, qt, (rows, cols)).astype(np.float64)
