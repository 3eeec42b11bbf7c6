"""numpy references for ds4's hyper-connection, norm, router and small elementwise ops.

One function per ``ds4_gpu_*_tensor`` call of ds4's ``ds4_gpu.h`` (the "hc/norm/
router family"), written from the semantics of ds4's own CPU path (``ds4.c``:
``embed_token_f16``, ``rms_norm_no_weight``, ``rms_norm_weight``,
``head_rms_norm_inplace``, ``hc_split_sinkhorn_one``, ``hc_weighted_sum_one``,
``hc_post_one``, ``output_hc_head_one``, the router functions, and
``cpu_directional_steering_project_rows``), never from a GPU backend's code.

Same argument order as the C call, output tensors dropped (they are returned)
and ``model_size`` dropped (it is ``len(model_map)``).  Where the C call takes
its token count from an output tensor's size, the reference takes ``n_tokens``
as its last argument.

Arithmetic is float64 on float32 inputs, results float32 -- except where ds4.c's
float32 arithmetic decides a discrete outcome: the router's selection scores
(prob + bias) are formed in float32 exactly as ds4.c does, so equal logits give
equal scores and the tie rule (lower expert index first) is what decides.

Errors the C call reports by returning 0 raise ``ValueError`` here.
"""
from __future__ import annotations

import numpy as np

from .ds4_ops import N_EXPERT, N_EXPERT_USED

EXPERT_WEIGHT_SCALE = 1.5      # ds4.c DS4_EXPERT_WEIGHT_SCALE
ROUTER_WEIGHT_FLOOR = 6.103515625e-5  # ds4.c: the selected probabilities' sum is floored at 2^-14


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

def _f32(v) -> float:
    """A scalar as the C call sees it (float parameters are float32)."""
    return float(np.float32(v))


def _vals(x, count: int, dtype=np.float32) -> np.ndarray:
    a = np.asarray(x, dtype=dtype).reshape(-1)
    if a.size < count:
        raise ValueError(f"tensor has {a.size} values, need {count}")
    return a[:count]


def _map_array(model_map, offset: int, count: int, dtype) -> np.ndarray:
    """`count` values of `dtype` at byte `offset` of the model map (ValueError outside it)."""
    m = model_map if isinstance(model_map, np.ndarray) else np.frombuffer(bytes(model_map), dtype=np.uint8)
    m = np.ascontiguousarray(m).reshape(-1).view(np.uint8)
    dt = np.dtype(dtype)
    offset, nbytes = int(offset), int(count) * dt.itemsize
    if offset < 0 or offset + nbytes > m.size:
        raise ValueError(f"range [{offset}, {offset + nbytes}) is outside the model map ({m.size} bytes)")
    return np.frombuffer(m[offset:offset + nbytes].tobytes(), dtype=dt)


def _rms_scale(rows64: np.ndarray, eps: float) -> np.ndarray:
    """ds4.c's RMS scale per row: sum of squares in double, then 1/sqrtf((float)(ss/n) + eps)."""
    ms = np.mean(rows64 * rows64, axis=-1, keepdims=True)
    return 1.0 / np.sqrt(ms.astype(np.float32).astype(np.float64) + _f32(eps))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


# ---------------------------------------------------------------------------
# Embedding and plain HC state plumbing
# ---------------------------------------------------------------------------

def embed_token_hc(model_map, weight_offset: int, n_vocab: int, token: int, n_embd: int, n_hc: int) -> np.ndarray:
    """ds4_gpu_embed_token_hc_tensor: the F16 row `token` of the [n_vocab][n_embd]
    embedding table, widened to float32 and copied into each of the n_hc streams
    (ds4.c embed_token_f16 + hc_from_plain_embedding).  Out: [n_hc][n_embd]."""
    table = _map_array(model_map, weight_offset, int(n_vocab) * int(n_embd), np.float16)
    if not 0 <= int(token) < int(n_vocab):
        raise ValueError(f"token {token} is outside the embedding table ({n_vocab} rows)")
    row = table.reshape(n_vocab, n_embd)[int(token)].astype(np.float32)
    return np.tile(row, (int(n_hc), 1))


def embed_tokens_hc(tokens, model_map, weight_offset: int, n_vocab: int, n_tokens: int, n_embd: int,
                    n_hc: int) -> np.ndarray:
    """ds4_gpu_embed_tokens_hc_tensor: embed_token_hc for each of n_tokens int32
    token ids.  Out: [n_tokens][n_hc][n_embd]."""
    toks = _vals(tokens, n_tokens, np.int32)
    return np.stack([embed_token_hc(model_map, weight_offset, n_vocab, int(t), n_embd, n_hc) for t in toks])


def repeat_hc(row, n_embd: int, n_hc: int) -> np.ndarray:
    """ds4_gpu_repeat_hc_tensor: one [n_embd] row copied into n_hc streams
    (ds4.c hc_from_plain_embedding).  Out: [n_hc][n_embd]."""
    return np.tile(_vals(row, n_embd), (int(n_hc), 1))


def add(a, b, n: int) -> np.ndarray:
    """ds4_gpu_add_tensor: out = a + b over n float32 values (one float32 rounding:
    the sum of two float32s is exact in float64, so rounding it once is IEEE's a + b)."""
    return (_vals(a, n).astype(np.float64) + _vals(b, n).astype(np.float64)).astype(np.float32)


# ---------------------------------------------------------------------------
# RMS norms
# ---------------------------------------------------------------------------

def rms_norm_plain(x, n: int, eps: float) -> np.ndarray:
    """ds4_gpu_rms_norm_plain_tensor: x / sqrt(mean(x^2) + eps) over one row of n
    (ds4.c rms_norm_no_weight; ds4 uses it on the flattened HC state, 16384 values)."""
    a = _vals(x, n).astype(np.float64)
    return (a * _rms_scale(a, eps)).astype(np.float32)


def rms_norm_weight_rows(x, model_map, weight_offset: int, n: int, rows: int, eps: float) -> np.ndarray:
    """ds4_gpu_rms_norm_weight_rows_tensor: per row, x / sqrt(mean(x^2) + eps) * w,
    w the float32 [n] norm weight at weight_offset in the map (ds4.c rms_norm_weight)."""
    w = _map_array(model_map, weight_offset, n, np.float32).astype(np.float64)
    a = _vals(x, int(n) * int(rows)).astype(np.float64).reshape(rows, n)
    return (a * _rms_scale(a, eps) * w).astype(np.float32)


def rms_norm_weight(x, model_map, weight_offset: int, n: int, eps: float) -> np.ndarray:
    """ds4_gpu_rms_norm_weight_tensor: rms_norm_weight_rows with one row.  Out: [n]."""
    return rms_norm_weight_rows(x, model_map, weight_offset, n, 1, eps).reshape(n)


def dsv4_qkv_rms_norm_rows(q, model_map, q_weight_offset: int, q_n: int, kv, kv_weight_offset: int, kv_n: int,
                           rows: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_dsv4_qkv_rms_norm_rows_tensor: two independent weighted RMS norms in one
    call, q rows ([rows][q_n], weight at q_weight_offset: ds4's attn_q_a_norm over the
    1024-wide q LoRA) and kv rows ([rows][kv_n], attn_kv_a_norm over 512)."""
    return (rms_norm_weight_rows(q, model_map, q_weight_offset, q_n, rows, eps),
            rms_norm_weight_rows(kv, model_map, kv_weight_offset, kv_n, rows, eps))


def head_rms_norm(x, n_tok: int, n_head: int, head_dim: int, eps: float) -> np.ndarray:
    """ds4_gpu_head_rms_norm_tensor (in place): each head_dim-wide head of each token
    scaled by 1/sqrt(mean(head^2) + eps), no weight (ds4.c head_rms_norm_inplace)."""
    a = _vals(x, int(n_tok) * int(n_head) * int(head_dim)).astype(np.float64).reshape(n_tok, n_head, head_dim)
    return (a * _rms_scale(a, eps)).astype(np.float32)


# ---------------------------------------------------------------------------
# Hyper-connections
# ---------------------------------------------------------------------------

def mix_width(n_hc: int) -> int:
    """Values per token of the HC control vector: n_hc pre, n_hc post, n_hc x n_hc combine."""
    return 2 * int(n_hc) + int(n_hc) * int(n_hc)


def hc_split_sinkhorn_rows(mix: np.ndarray, scale, base, n_hc: int, iters: int, eps: float) -> np.ndarray:
    """ds4.c hc_split_sinkhorn_one on rows of mix ([rows][2n+n^2], float64 math):

      pre[i]  = sigmoid(mix[i] * scale[0] + base[i]) + eps
      post[i] = 2 * sigmoid(mix[n+i] * scale[1] + base[n+i])
      comb[dst][src] (stored at 2n + src + dst*n): softmax over src of
                mix * scale[2] + base, plus eps; then the columns (fixed src,
                summed over dst) divided by (sum + eps); then iters-1 rounds of
                rows then columns, each divided by (sum + eps)."""
    n = int(n_hc)
    mw = mix_width(n)
    m = np.asarray(mix, dtype=np.float64).reshape(-1, mw)
    s = np.asarray(scale, dtype=np.float64).reshape(-1)[:3]
    b = np.asarray(base, dtype=np.float64).reshape(-1)[:mw]
    e = _f32(eps)
    out = np.empty_like(m)
    out[:, :n] = _sigmoid(m[:, :n] * s[0] + b[:n]) + e
    out[:, n:2 * n] = 2.0 * _sigmoid(m[:, n:2 * n] * s[1] + b[n:2 * n])
    c = (m[:, 2 * n:] * s[2] + b[2 * n:]).reshape(-1, n, n)  # [row][dst][src]
    c = np.exp(c - c.max(axis=2, keepdims=True))
    c = c / c.sum(axis=2, keepdims=True) + e
    c = c / (c.sum(axis=1, keepdims=True) + e)
    for _ in range(1, int(iters)):
        c = c / (c.sum(axis=2, keepdims=True) + e)
        c = c / (c.sum(axis=1, keepdims=True) + e)
    out[:, 2 * n:] = c.reshape(-1, n * n)
    return out


def hc_split_sinkhorn(mix, model_map, scale_offset: int, base_offset: int, n_hc: int, sinkhorn_iters: int,
                      eps: float, n_rows: int) -> np.ndarray:
    """ds4_gpu_hc_split_sinkhorn_tensor: hc_split_sinkhorn_rows for n_rows tokens, the
    three scales (float32 [3]) and the base ([2n+n^2]) read from the map.
    Out: [n_rows][2n+n^2] (ds4: n_hc 4, 24 values, 20 iterations, eps 1e-6)."""
    mw = mix_width(n_hc)
    scale = _map_array(model_map, scale_offset, 3, np.float32)
    base = _map_array(model_map, base_offset, mw, np.float32)
    m = _vals(mix, int(n_rows) * mw)
    return hc_split_sinkhorn_rows(m, scale, base, n_hc, sinkhorn_iters, eps).astype(np.float32)


def hc_weighted_sum_strided(residual_hc, weights, n_embd: int, n_hc: int, n_tokens: int, stride: int) -> np.ndarray:
    """out[t][d] = sum_h x[t][h][d] * w[t*stride + h] (ds4.c hc_weighted_sum_one per token)."""
    x = _vals(residual_hc, int(n_tokens) * int(n_hc) * int(n_embd)).astype(np.float64)
    x = x.reshape(n_tokens, n_hc, n_embd)
    w = _vals(weights, (int(n_tokens) - 1) * int(stride) + int(n_hc)).astype(np.float64)
    wt = np.stack([w[t * stride:t * stride + n_hc] for t in range(n_tokens)])
    return np.einsum("thd,th->td", x, wt).astype(np.float32)


def hc_weighted_sum(residual_hc, weights, n_embd: int, n_hc: int, n_tokens: int) -> np.ndarray:
    """ds4_gpu_hc_weighted_sum_tensor: weights are [n_tokens][n_hc].  Out: [n_tokens][n_embd]."""
    return hc_weighted_sum_strided(residual_hc, weights, n_embd, n_hc, n_tokens, n_hc)


def hc_weighted_sum_split(residual_hc, split, n_embd: int, n_hc: int, n_tokens: int) -> np.ndarray:
    """ds4_gpu_hc_weighted_sum_split_tensor: the weights are the pre part (first n_hc)
    of each token's split row ([n_tokens][2n+n^2])."""
    return hc_weighted_sum_strided(residual_hc, split, n_embd, n_hc, n_tokens, mix_width(n_hc))


def hc_split_weighted_sum(mix, residual_hc, model_map, scale_offset: int, base_offset: int, n_embd: int,
                          n_hc: int, sinkhorn_iters: int, eps: float, n_rows: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """ds4_gpu_hc_split_weighted_sum_tensor: the split of each token (hc_split_sinkhorn)
    and the stream sum weighted by its pre part.  Returns (out [n_rows][n_embd],
    split [n_rows][2n+n^2]); the weighted sum uses the float32 split, as ds4.c does."""
    split = hc_split_sinkhorn(mix, model_map, scale_offset, base_offset, n_hc, sinkhorn_iters, eps, n_rows)
    return hc_weighted_sum_split(residual_hc, split, n_embd, n_hc, n_rows), split


def hc_split_weighted_sum_norm(mix, residual_hc, model_map, scale_offset: int, base_offset: int,
                               norm_weight_offset: int, n_embd: int, n_hc: int, sinkhorn_iters: int, eps: float,
                               norm_eps: float, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ds4_gpu_hc_split_weighted_sum_norm_tensor: hc_split_weighted_sum, then each
    out row's weighted RMS norm (weight [n_embd] at norm_weight_offset, norm_eps): ds4's
    decode attn/ffn pre-norm.  Returns (out, norm_out, split)."""
    out, split = hc_split_weighted_sum(mix, residual_hc, model_map, scale_offset, base_offset, n_embd, n_hc,
                                       sinkhorn_iters, eps, n_rows)
    norm = rms_norm_weight_rows(out, model_map, norm_weight_offset, n_embd, n_rows, norm_eps)
    return out, norm, split


def output_hc_weights(pre, model_map, scale_offset: int, base_offset: int, n_hc: int, eps: float,
                      n_tokens: int) -> np.ndarray:
    """ds4_gpu_output_hc_weights_tensor: w[t][h] = sigmoid(pre[t][h] * scale + base[h]) + eps
    (ds4.c output_hc_head_one; scale is one float32, base [n_hc])."""
    scale = float(_map_array(model_map, scale_offset, 1, np.float32)[0])
    base = _map_array(model_map, base_offset, n_hc, np.float32).astype(np.float64)
    p = _vals(pre, int(n_tokens) * int(n_hc)).astype(np.float64).reshape(n_tokens, n_hc)
    return (_sigmoid(p * scale + base) + _f32(eps)).astype(np.float32)


def hc_expand_strided(block_out, block_add, residual_hc, post, comb, n_embd: int, n_hc: int, n_tokens: int,
                      post_stride: int, comb_stride: int) -> np.ndarray:
    """ds4.c hc_post_one per token: out[dst][d] = (block[d] (+ add[d])) * post[dst]
    + sum_src comb[dst + src*n_hc] * residual[src][d]."""
    n, t_ = int(n_hc), int(n_tokens)
    blk = _vals(block_out, t_ * n_embd).astype(np.float64).reshape(t_, n_embd)
    if block_add is not None:
        blk = blk + _vals(block_add, t_ * n_embd).astype(np.float64).reshape(t_, n_embd)
    res = _vals(residual_hc, t_ * n * n_embd).astype(np.float64).reshape(t_, n, n_embd)
    p = _vals(post, (t_ - 1) * post_stride + n).astype(np.float64)
    c = _vals(comb, (t_ - 1) * comb_stride + n * n).astype(np.float64)
    pt = np.stack([p[t * post_stride:t * post_stride + n] for t in range(t_)])            # [t][dst]
    ct = np.stack([c[t * comb_stride:t * comb_stride + n * n] for t in range(t_)])
    ct = ct.reshape(t_, n, n)  # [t][src][dst]: flat index dst + src*n
    out = blk[:, None, :] * pt[:, :, None] + np.einsum("tsk,tsd->tkd", ct, res)
    return out.astype(np.float32)


def hc_expand(block_out, residual_hc, post, comb, n_embd: int, n_hc: int, n_tokens: int) -> np.ndarray:
    """ds4_gpu_hc_expand_tensor: post [n_tokens][n_hc], comb [n_tokens][n_hc*n_hc].
    Out: [n_tokens][n_hc][n_embd]."""
    return hc_expand_strided(block_out, None, residual_hc, post, comb, n_embd, n_hc, n_tokens, n_hc,
                             int(n_hc) * int(n_hc))


def _split_parts(split, n_hc: int, n_tokens: int):
    mw = mix_width(n_hc)
    s = _vals(split, int(n_tokens) * mw)
    return s[n_hc:], s[2 * n_hc:], mw


def hc_expand_split(block_out, residual_hc, split, n_embd: int, n_hc: int, n_tokens: int) -> np.ndarray:
    """ds4_gpu_hc_expand_split_tensor: hc_expand with post and comb taken from each
    token's split row (post at n_hc, comb at 2*n_hc, row stride 2n+n^2)."""
    post, comb, mw = _split_parts(split, n_hc, n_tokens)
    return hc_expand_strided(block_out, None, residual_hc, post, comb, n_embd, n_hc, n_tokens, mw, mw)


def hc_expand_add_split(block_out, block_add, residual_hc, split, n_embd: int, n_hc: int,
                        n_tokens: int) -> np.ndarray:
    """ds4_gpu_hc_expand_add_split_tensor: hc_expand_split of block_out + block_add
    (ds4's FFN: shared expert output + routed output, added before the post gate)."""
    post, comb, mw = _split_parts(split, n_hc, n_tokens)
    return hc_expand_strided(block_out, block_add, residual_hc, post, comb, n_embd, n_hc, n_tokens, mw, mw)


# ---------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------

def router_probs(logits: np.ndarray) -> np.ndarray:
    """sqrt(softplus(logit)) per expert, float32 (ds4.c layer_router_probs_one with
    softplus_stable: x above 20, exp(x) below -20, log1p(exp(x)) between)."""
    z = np.asarray(logits, dtype=np.float32).astype(np.float64)
    with np.errstate(over="ignore"):
        sp = np.where(z > 20.0, z, np.where(z < -20.0, np.exp(z), np.log1p(np.exp(np.minimum(z, 20.0)))))
    return np.sqrt(sp.astype(np.float32).astype(np.float64)).astype(np.float32)


def topk_desc(score: np.ndarray, k: int) -> np.ndarray:
    """ds4.c topk_desc: the k largest scores, descending; equal scores keep the lower
    index first (its insertion scan only moves an entry for a strictly larger score)."""
    order = np.lexsort((np.arange(score.size), -score.astype(np.float64)))
    return order[:k].astype(np.int32)


def router_selection_scores(probs: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """What the top-k ranks: probs (+ bias), added in float32 as ds4.c does."""
    return probs if bias is None else (probs + bias.astype(np.float32)).astype(np.float32)


def _router_weights(probs: np.ndarray, sel: np.ndarray) -> np.ndarray:
    w = probs.astype(np.float64)[sel]
    total = max(float(np.float32(w.sum())), ROUTER_WEIGHT_FLOOR)
    return (w / total * EXPERT_WEIGHT_SCALE).astype(np.float32)


def _router_rows(model_map, bias_offset, hash_offset, hash_rows, n_expert_groups, n_group_used, has_bias,
                 hash_mode, logits, toks):
    if int(n_expert_groups) > 1 or int(n_group_used) > 0:
        raise ValueError("expert groups are not part of ds4's router (n_expert_groups <= 1, n_group_used 0)")
    n_tokens = len(toks)
    lg = _vals(logits, n_tokens * N_EXPERT).reshape(n_tokens, N_EXPERT)
    bias = None
    if has_bias and not hash_mode:
        bias = _map_array(model_map, bias_offset, N_EXPERT, np.float32)
    table = None
    if hash_mode:
        table = _map_array(model_map, hash_offset, int(hash_rows) * N_EXPERT_USED, np.int32)
        table = table.reshape(int(hash_rows), N_EXPERT_USED)
    sel = np.empty((n_tokens, N_EXPERT_USED), np.int32)
    w = np.empty((n_tokens, N_EXPERT_USED), np.float32)
    probs = np.empty((n_tokens, N_EXPERT), np.float32)
    keys = np.empty((n_tokens, N_EXPERT), np.float32)
    for t in range(n_tokens):
        probs[t] = router_probs(lg[t])
        keys[t] = router_selection_scores(probs[t], bias)
        if hash_mode:  # ds4.c layer_hash_selected_experts: the token's row of the tid2eid table
            tok = int(toks[t])
            if not 0 <= tok < int(hash_rows):
                raise ValueError(f"token {tok} is outside the hash routing table ({hash_rows} rows)")
            sel[t] = table[tok]
            if np.any((sel[t] < 0) | (sel[t] >= N_EXPERT)):
                raise ValueError("hash-selected expert is outside the router range")
        else:
            sel[t] = topk_desc(keys[t], N_EXPERT_USED)
        w[t] = _router_weights(probs[t], sel[t])
    return sel, w, probs, keys


def router_select(model_map, bias_offset: int, hash_offset: int, hash_rows: int, token: int, n_expert_groups: int,
                  n_group_used: int, has_bias: bool, hash_mode: bool, logits):
    """ds4_gpu_router_select_tensor, one token: probs = sqrt(softplus(logits[256]));
    selected = the 6 experts of the token's hash row (hash_mode: ds4's first 3 layers)
    or the top 6 of probs + bias (bias only when has_bias and not hash_mode; ties:
    lower index first); weights = probs[selected] / max(sum, 2^-14) * 1.5 (unbiased).
    Returns (selected [6] int32, weights [6], probs [256], selection keys [256])."""
    sel, w, probs, keys = _router_rows(model_map, bias_offset, hash_offset, hash_rows, n_expert_groups,
                                       n_group_used, has_bias, hash_mode, logits, [int(token)])
    return sel[0], w[0], probs[0], keys[0]


def router_select_batch(model_map, bias_offset: int, hash_offset: int, hash_rows: int, n_expert_groups: int,
                        n_group_used: int, has_bias: bool, hash_mode: bool, logits, tokens, n_tokens: int):
    """ds4_gpu_router_select_batch_tensor: router_select for each of n_tokens tokens
    (token ids from `tokens`, used in hash mode).  Returns ([n][6], [n][6], [n][256], keys)."""
    toks = _vals(tokens, n_tokens, np.int32)
    return _router_rows(model_map, bias_offset, hash_offset, hash_rows, n_expert_groups, n_group_used, has_bias,
                        hash_mode, logits, toks)


# ---------------------------------------------------------------------------
# Steering and masks
# ---------------------------------------------------------------------------

def directional_steering_project(x, directions, layer: int, width: int, rows: int, scale: float) -> np.ndarray:
    """ds4_gpu_directional_steering_project_tensor (in place): each row of x minus
    scale * (row . dir) * dir, dir = row `layer` of directions ([layers][width])
    (ds4.c cpu_directional_steering_project_rows).  scale 0 means steering is off,
    which the GPU call reports as an error."""
    if _f32(scale) == 0.0 or int(width) == 0 or int(rows) == 0:
        raise ValueError("directional steering needs width, rows and a non-zero scale")
    d = _vals(directions, (int(layer) + 1) * int(width)).astype(np.float64)[int(layer) * width:]
    a = _vals(x, int(rows) * int(width)).astype(np.float64).reshape(rows, width)
    coeff = _f32(scale) * (a @ d)
    return (a - coeff[:, None] * d[None, :]).astype(np.float32)


def dsv4_topk_mask(topk, n_comp: int, n_tokens: int, top_k: int) -> np.ndarray:
    """ds4_gpu_dsv4_topk_mask_tensor: the additive attention mask of the indexer's
    choice: mask[t][c] = 0 when c is among topk[t][0..top_k), else -inf (ds4's sparse
    attention only sees the selected compressed rows).  Out: [n_tokens][n_comp]."""
    if not (int(n_comp) and int(n_tokens) and int(top_k)):
        raise ValueError("n_comp, n_tokens and top_k must be non-zero")
    sel = _vals(topk, int(n_tokens) * int(top_k), np.int32).reshape(n_tokens, top_k).astype(np.int64)
    mask = np.full((int(n_tokens), int(n_comp)), -np.inf, dtype=np.float32)
    for t in range(int(n_tokens)):
        hit = sel[t][(sel[t] >= 0) & (sel[t] < int(n_comp))]
        mask[t, hit] = 0.0
    return mask
