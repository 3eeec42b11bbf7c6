"""numpy references for ds4's weight-reading ops beyond the plain Q8_0 projection.

One function per ``ds4_gpu_*_tensor`` call, written from the semantics of
ds4's CPU path (``ds4.c``), never from a GPU backend.  Same conventions as
``reference.ds4_ops`` (whose constants and helpers this module uses): the C
argument order with output tensors dropped (they are returned, in header
order) and ``model_size`` dropped; float64 arithmetic on float32 inputs,
float32 results; a call the C code refuses (returns 0) raises ``ValueError``.

Activation quantization follows ds4.c where ds4.c has it:

* F16 and F32 projections (``matvec_f16`` / the plain F32 matmul): x stays
  float32, no quantization.
* Q8_0 projections (shared expert, attention output A and B, the HC-expanding
  projections): x is quantized to Q8_0 per block of 32
  (``ds4_ops.quantize_q8_0_activation``), as ds4.c's ``matvec_q8_0`` and
  ``matvec_q8_0_grouped_rows`` do.
* routed experts: x and each slot's SwiGLU output are quantized to Q8_K
  (``ds4_ops.quantize_q8_K``).  ds4.c's CPU path holds only the
  IQ2_XXS/Q2_K experts; the Q4_K variant ("high-memory" models) is modelled the
  same way (Q8_K activations, Q4_K blocks as ggml defines them), because the
  API contract is the same call with other type numbers.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import quant
from .ds4_ops import (GGML_TYPE, N_EXPERT, QK_K, _dequant_activation, _f32, _map, _rows, _weight_bytes,
                      quantize_q8_0_activation, quantize_q8_K, swiglu)
from .quant import QT

#: routed-expert type pairs (gate/up type, down type) the call accepts
# threads for routed_moe's experts (each holds its three dequantised matrices, ~200 MB at ds4's sizes)
MOE_REFERENCE_THREADS = int(os.environ.get("PORTER_MOE_REFERENCE_THREADS", min(8, os.cpu_count() or 1)))

MOE_TYPE_PAIRS = {(GGML_TYPE["IQ2_XXS"], GGML_TYPE["Q2_K"]): (QT.IQ2_XXS, QT.Q2_K),
                  (GGML_TYPE["Q4_K"], GGML_TYPE["Q4_K"]): (QT.Q4_K, QT.Q4_K)}


# ---------------------------------------------------------------------------
# Dense F16 / F32 projections
# ---------------------------------------------------------------------------

def _dense(model_map, offset: int, in_dim: int, out_dim: int, dtype: str) -> np.ndarray:
    in_dim, out_dim = int(in_dim), int(out_dim)
    if in_dim == 0 or out_dim == 0:
        raise ValueError("in_dim and out_dim must be >= 1")
    item = np.dtype(dtype).itemsize
    raw = _weight_bytes(model_map, offset, out_dim * in_dim * item)
    return raw.view(dtype).astype(np.float64).reshape(out_dim, in_dim)


def matmul_f16(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """ds4_gpu_matmul_f16_tensor: out[t][o] = sum_i W[o][i] x[t][i], W F16 rows of in_dim
    at weight_offset, x float32 (ds4.c's matvec_f16: no activation quantization)."""
    n_tok = int(n_tok)
    if n_tok == 0:
        raise ValueError("n_tok must be >= 1")
    w = _dense(model_map, weight_offset, in_dim, out_dim, "<f2")
    return (_rows(x, n_tok, int(in_dim)).astype(np.float64) @ w.T).astype(np.float32)


def matmul_f16_pair(model_map, weight_a_offset: int, weight_b_offset: int, in_dim: int, out_dim: int, x,
                    n_tok: int) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_matmul_f16_pair_tensor: two F16 projections of the same x (the compressor's
    kv and gate), same in/out sizes -> (out_a, out_b)."""
    return (matmul_f16(model_map, weight_a_offset, in_dim, out_dim, x, n_tok),
            matmul_f16(model_map, weight_b_offset, in_dim, out_dim, x, n_tok))


def matmul_f32(model_map, weight_offset: int, in_dim: int, out_dim: int, x, n_tok: int) -> np.ndarray:
    """ds4_gpu_matmul_f32_tensor: as matmul_f16 with F32 weight rows."""
    n_tok = int(n_tok)
    if n_tok == 0:
        raise ValueError("n_tok must be >= 1")
    w = _dense(model_map, weight_offset, in_dim, out_dim, "<f4")
    return (_rows(x, n_tok, int(in_dim)).astype(np.float64) @ w.T).astype(np.float32)


# ---------------------------------------------------------------------------
# Q8_0 projections with Q8_0-quantized activations
# ---------------------------------------------------------------------------

def q8_0_weights(model_map, offset: int, rows: int, in_dim: int) -> np.ndarray:
    """rows x in_dim Q8_0 weights (rows of ceil(in_dim/32) blocks) as float64, padding dropped."""
    blocks = (int(in_dim) + 31) // 32
    raw = _weight_bytes(model_map, offset, int(rows) * blocks * 34)
    return quant.dequantize(raw, QT.Q8_0, (int(rows), blocks * 32))[:, :int(in_dim)].astype(np.float64)


def q8_0_project(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W (rows, in_dim) float64 times Q8_0(x) for each row of x (n, in_dim) -> (n, rows) float64."""
    n, in_dim = x.shape
    q, d = quantize_q8_0_activation(x.astype(np.float32))
    xd = _dequant_activation(q, d, 32)[:, :in_dim]
    return xd @ w.T


def hc_post(block_out: np.ndarray, residual_hc: np.ndarray, split: np.ndarray, n_embd: int, n_hc: int) -> np.ndarray:
    """ds4.c's hc_post_one: out_hc[dst][d] = block[d] * post[dst] + sum_src comb[dst + src*n_hc] * res[src][d],
    with post = split[n_hc:2 n_hc], comb = split[2 n_hc:] (the Sinkhorn split's layout)."""
    s = np.asarray(split, dtype=np.float32).reshape(-1).astype(np.float64)
    post = s[n_hc:2 * n_hc]
    comb = s[2 * n_hc:2 * n_hc + n_hc * n_hc].reshape(n_hc, n_hc)  # comb[src][dst]
    res = _rows(residual_hc, n_hc, n_embd).astype(np.float64)
    return post[:, None] * np.asarray(block_out, dtype=np.float64)[None, :] + comb.T @ res


def _split_len(n_hc: int) -> int:
    return 2 * n_hc + n_hc * n_hc


def matmul_q8_0_hc_expand(model_map, weight_offset: int, in_dim: int, out_dim: int, x, residual_hc, split,
                          n_embd: int, n_hc: int) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_matmul_q8_0_hc_expand_tensor for one token -> (out_hc [n_hc][n_embd], block_out [out_dim]).

    block_out = W Q8_0(x) (W Q8_0, out_dim x in_dim), then the HC post step
    (``hc_post``) mixes it into the residual streams.  out_dim must equal n_embd."""
    in_dim, out_dim, n_embd, n_hc = int(in_dim), int(out_dim), int(n_embd), int(n_hc)
    if in_dim == 0 or out_dim == 0 or n_embd == 0 or n_hc == 0 or out_dim != n_embd:
        raise ValueError("need in_dim, n_hc >= 1 and out_dim == n_embd")
    w = q8_0_weights(model_map, weight_offset, out_dim, in_dim)
    block = q8_0_project(w, _rows(x, 1, in_dim))[0]
    block32 = block.astype(np.float32)
    out_hc = hc_post(block32, residual_hc, _rows(split, 1, _split_len(n_hc))[0], n_embd, n_hc)
    return out_hc.astype(np.float32), block32


def shared_down_hc_expand_q8_0(model_map, weight_offset: int, in_dim: int, out_dim: int, shared_mid, routed_out,
                               residual_hc, split, n_embd: int, n_hc: int) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_shared_down_hc_expand_q8_0_tensor -> (out_hc, shared_out).

    shared_out = W_down Q8_0(shared_mid) (the shared expert's down projection
    alone); the FFN output mixed into the HC streams is shared_out + routed_out."""
    in_dim, out_dim, n_embd, n_hc = int(in_dim), int(out_dim), int(n_embd), int(n_hc)
    if in_dim == 0 or out_dim == 0 or n_embd == 0 or n_hc == 0 or out_dim != n_embd:
        raise ValueError("need in_dim, n_hc >= 1 and out_dim == n_embd")
    w = q8_0_weights(model_map, weight_offset, out_dim, in_dim)
    shared = q8_0_project(w, _rows(shared_mid, 1, in_dim))[0].astype(np.float32)
    ffn = shared.astype(np.float64) + _rows(routed_out, 1, out_dim)[0].astype(np.float64)
    out_hc = hc_post(ffn.astype(np.float32), residual_hc, _rows(split, 1, _split_len(n_hc))[0], n_embd, n_hc)
    return out_hc.astype(np.float32), shared


def shared_gate_up_swiglu_q8_0(model_map, gate_offset: int, up_offset: int, in_dim: int, out_dim: int, x,
                               clamp: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ds4_gpu_shared_gate_up_swiglu_q8_0_tensor for one token -> (gate, up, mid).

    gate, up = W_gate Q8_0(x), W_up Q8_0(x) (unclamped); mid = swiglu(gate, up,
    clamp, weight 1) as ds4_ops.swiglu (the clamp applies inside the SwiGLU only)."""
    in_dim, out_dim = int(in_dim), int(out_dim)
    if in_dim == 0 or out_dim == 0:
        raise ValueError("in_dim and out_dim must be >= 1")
    xr = _rows(x, 1, in_dim)
    g = q8_0_project(q8_0_weights(model_map, gate_offset, out_dim, in_dim), xr)[0].astype(np.float32)
    u = q8_0_project(q8_0_weights(model_map, up_offset, out_dim, in_dim), xr)[0].astype(np.float32)
    return g, u, swiglu(g, u, out_dim, clamp, 1.0)


def attention_output_low_q8(model_map, out_a_offset: int, group_dim: int, rank: int, n_groups: int,
                            heads, n_tokens: int = 1) -> np.ndarray:
    """ds4_gpu_attention_output_low_q8_tensor (n_tokens = 1) -> low [n_tokens][n_groups * rank].

    heads[t] is n_groups groups of group_dim values (8 groups of 8 heads x 512
    in ds4); W_a holds n_groups * rank Q8_0 rows of group_dim; group g's
    rank rows see only group g:  low[t][g*rank + r] = W_a[g*rank + r] . Q8_0(heads[t][g])
    (ds4.c's matvec_q8_0_grouped_rows)."""
    group_dim, rank, n_groups, n_tokens = int(group_dim), int(rank), int(n_groups), int(n_tokens)
    if group_dim == 0 or rank == 0 or n_groups == 0 or n_tokens == 0:
        raise ValueError("group_dim, rank, n_groups and n_tokens must be >= 1")
    w = q8_0_weights(model_map, out_a_offset, n_groups * rank, group_dim).reshape(n_groups, rank, group_dim)
    h = _rows(heads, n_tokens * n_groups, group_dim)
    q, d = quantize_q8_0_activation(h)
    hd = _dequant_activation(q, d, 32)[:, :group_dim].reshape(n_tokens, n_groups, group_dim)
    low = np.empty((n_tokens, n_groups, rank), dtype=np.float64)
    for g in range(n_groups):
        low[:, g, :] = hd[:, g, :] @ w[g].T
    return low.reshape(n_tokens, n_groups * rank).astype(np.float32)


def attention_output_q8_batch(model_map, out_a_offset: int, out_b_offset: int, group_dim: int, rank: int,
                              n_groups: int, out_dim: int, heads, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_attention_output_q8_batch_tensor -> (out [n_tokens][out_dim], low [n_tokens][n_groups*rank]).

    low as attention_output_low_q8 for every token, then out = W_b Q8_0(low)
    (W_b: out_dim Q8_0 rows of n_groups * rank), ds4.c's layer_grouped_out_batch."""
    out_dim = int(out_dim)
    if out_dim == 0:
        raise ValueError("out_dim must be >= 1")
    low = attention_output_low_q8(model_map, out_a_offset, group_dim, rank, n_groups, heads, n_tokens)
    wb = q8_0_weights(model_map, out_b_offset, out_dim, int(n_groups) * int(rank))
    return q8_0_project(wb, low).astype(np.float32), low


# ---------------------------------------------------------------------------
# Routed experts (one token or a prefill batch)
# ---------------------------------------------------------------------------

def routed_moe(model_map, gate_offset: int, up_offset: int, down_offset: int, gate_type: int, down_type: int,
               gate_expert_bytes: int, gate_row_bytes: int, down_expert_bytes: int, down_row_bytes: int,
               expert_in_dim: int, expert_mid_dim: int, out_dim: int, selected, weights, n_expert: int,
               clamp: float, x, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_routed_moe_batch_tensor -> (out [n_tokens][out_dim], mid [n_tokens][n_expert][mid_dim]).

    Per token t and slot k, expert e = selected[t][k] (a negative id reads
    expert 0), router weight w = weights[t][k]:
        g, u   = W_gate[e] Q8_K(x[t]), W_up[e] Q8_K(x[t])   (clamp > 1e-6: g = min(g, c), u = clip(u, -c, c))
        mid    = silu(g) * u * w
        out[t] = sum_k W_down[e] Q8_K(mid)
    Expert e's gate/up matrices ([mid_dim][in_dim]) start at
    gate_offset/up_offset + e * gate_expert_bytes, rows gate_row_bytes apart; its
    down matrix ([out_dim][mid_dim]) at down_offset + e * down_expert_bytes, rows
    down_row_bytes apart.  Type pairs: (IQ2_XXS, Q2_K) and (Q4_K, Q4_K).  The
    call fails for another pair, n_tokens or n_expert 0, in/mid dims not a
    multiple of 256, or expert tensors (256 experts each) outside the map."""
    in_dim, mid_dim, out_dim = int(expert_in_dim), int(expert_mid_dim), int(out_dim)
    n_expert, n_tokens = int(n_expert), int(n_tokens)
    pair = (int(gate_type), int(down_type))
    if pair not in MOE_TYPE_PAIRS:
        raise ValueError(f"type pair {pair} is neither (IQ2_XXS, Q2_K) nor (Q4_K, Q4_K)")
    gqt, dqt = MOE_TYPE_PAIRS[pair]
    if n_expert == 0 or n_tokens == 0 or in_dim % QK_K or mid_dim % QK_K:
        raise ValueError("in_dim and mid_dim must be multiples of 256, n_expert and n_tokens >= 1")
    m = _map(model_map)
    for name, off, per in (("gate", gate_offset, gate_expert_bytes), ("up", up_offset, gate_expert_bytes),
                           ("down", down_offset, down_expert_bytes)):
        if int(off) > m.size or N_EXPERT * int(per) > m.size - int(off):
            raise ValueError(f"{name} experts (256 x {per} bytes at {off}) do not fit the map ({m.size} bytes)")
    ids = np.asarray(selected, dtype=np.int32).reshape(-1)[: n_tokens * n_expert].reshape(n_tokens, n_expert)
    wts = np.asarray(weights, dtype=np.float32).reshape(-1)[: n_tokens * n_expert].reshape(n_tokens, n_expert)
    xq, xd = quantize_q8_K(_rows(x, n_tokens, in_dim))
    xv = _dequant_activation(xq, xd, QK_K)
    c = _f32(clamp)
    g_rb, d_rb = quant.row_bytes(gqt, in_dim), quant.row_bytes(dqt, mid_dim)

    def expert(e: int):
        """Expert e's share: its (token, slot) pairs, their mid rows and down-projected rows."""
        gw = expert_matrix(m, int(gate_offset) + e * int(gate_expert_bytes), int(gate_row_bytes), g_rb, mid_dim, gqt, in_dim)
        uw = expert_matrix(m, int(up_offset) + e * int(gate_expert_bytes), int(gate_row_bytes), g_rb, mid_dim, gqt, in_dim)
        dw = expert_matrix(m, int(down_offset) + e * int(down_expert_bytes), int(down_row_bytes), d_rb, out_dim, dqt, mid_dim)
        tk = np.argwhere(np.maximum(ids, 0) == e)          # (pairs, 2): token, slot
        g = xv[tk[:, 0]] @ gw.T
        u = xv[tk[:, 0]] @ uw.T
        if c > _f32(1e-6):
            g = np.minimum(g, c)
            u = np.clip(u, -c, c)
        with np.errstate(over="ignore"):
            mm = (g / (1.0 + np.exp(-g)) * u * wts[tk[:, 0], tk[:, 1]][:, None].astype(np.float64)).astype(np.float32)
        mq, md = quantize_q8_K(mm)
        return tk, mm, _dequant_activation(mq, md, QK_K) @ dw.T

    mid = np.zeros((n_tokens, n_expert, mid_dim), dtype=np.float32)
    out = np.zeros((n_tokens, out_dim), dtype=np.float64)
    experts = sorted({max(int(v), 0) for v in ids.reshape(-1)})
    # Experts are independent: their dequantisation (most of a prefill reference's minutes) runs in
    # threads (numpy leaves the GIL for the array work), and their rows are summed into `out` in
    # expert order afterwards, so the result is the same to the bit for any thread count.
    workers = max(1, min(MOE_REFERENCE_THREADS, len(experts)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for tk, mm, rows in pool.map(expert, experts):
            mid[tk[:, 0], tk[:, 1]] = mm
            np.add.at(out, tk[:, 0], rows)
    return out.astype(np.float32), mid


def routed_moe_one(model_map, gate_offset, up_offset, down_offset, gate_type, down_type, gate_expert_bytes,
                   gate_row_bytes, down_expert_bytes, down_row_bytes, expert_in_dim, expert_mid_dim, out_dim,
                   selected, weights, n_expert, clamp, x) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_routed_moe_one_tensor: ``routed_moe`` with n_tokens = 1 -> (out [out_dim], mid [n_expert][mid_dim])."""
    out, mid = routed_moe(model_map, gate_offset, up_offset, down_offset, gate_type, down_type, gate_expert_bytes,
                          gate_row_bytes, down_expert_bytes, down_row_bytes, expert_in_dim, expert_mid_dim, out_dim,
                          selected, weights, n_expert, clamp, x, 1)
    return out[0], mid[0]


def expert_matrix(m: np.ndarray, offset: int, row_stride: int, row_bytes: int, rows: int, qt, cols: int) -> np.ndarray:
    """rows x cols weights of type qt whose rows start row_stride bytes apart (float64)."""
    if row_stride == row_bytes:
        raw = _weight_bytes(m, offset, rows * row_bytes)
    else:
        raw = np.concatenate([_weight_bytes(m, offset + r * row_stride, row_bytes) for r in range(rows)])
    return quant.dequantize(raw, qt, (rows, cols)).astype(np.float64)
