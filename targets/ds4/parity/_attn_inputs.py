"""Inputs shaped like ds4's own, shared by the attention / KV / compressor / indexer specs.

Loaded with porter.spec.sibling (a leading '_' keeps it from being read as a spec).

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
import math as _math

import numpy as np

from porter.spec import Context
from reference import ds4_attention_ops as A
from reference import ds4_ops as _ops

D = A.HEAD_DIM


INDEXER_INPUTS = ("q and compressed index rows ~ N(0, 1) through ds4's Hadamard + FP4 QAT (exact in f16); "
                  "head weights ~ N(0, 1)")
KV_INPUTS = ("KV rows ~ N(0, 1) (scaled where a case says so), caches of f16-rounded N(0, 1) rows; FP8 cases "
             "hold values at e4m3 codes, halfway points and past the 448 saturation")

ATTENTION_INPUTS = (
    "q ~ N(0, 1.5^2) and KV rows ~ N(0, 1) after ds4's FP8 + f16 rounding (scores ~ N(0, 1.5^2)); "
    "sinks ~ U(-2, 4); edge: scores shifted by +200 (a common direction in q and every KV row)")

# Scores the softmax sees, shifted by a common +SCORE_SHIFT: softmax is shift-invariant, so the right
# answer is as well conditioned as at moderate scores, but exp(score) overflows float32 past 88.7:
# a kernel that does not subtract the row's maximum returns inf/inf.  Every upstream attention path
# subtracts it (the plain, cuBLAS-softmax and online kernels of ds4_cuda.cu all take expf(s - max_s)),
# and the score GEMM scales after the product (cuBLAS alpha), so the f16 q and KV values stay exact.
SCORE_SHIFT = 200.0
EDGE_SHIFTED = f"scores shifted by +{SCORE_SHIFT:g} (exp overflows float32 without the max subtracted)"
_SHIFT_NOISE = 0.2  # KV rows = direction + N(0, 0.2^2): score spread ~ 0.2 * shift / sqrt(head_dim)


def shifted(dims):
    """A case's dims with its scores shifted past exp's range (attention_call reads score_shift)."""
    return {**dims, "score_shift": SCORE_SHIFT}


def _shift_direction(rng, head_dim):
    return rng.choice(np.array([-1.0, 1.0], np.float32), head_dim)


def kv_rows(rng, n, head_dim=D, n_rot=A.N_ROT, scale=1.0, base=None):
    x = (rng.standard_normal((n, head_dim)) * scale).astype(np.float32)
    if base is not None:
        x = x + base[None, :].astype(np.float32)
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


# ---------------------------------------------------------------------------
# attention (every entry point: one builder, the unit's parameters picked by `kind`)
# ---------------------------------------------------------------------------

NEG_INF = np.float32(-np.inf)


def _selection(rng, n_tokens, n_comp, keep):
    """Per token, `keep` distinct compressed rows (what the indexer's top-k picks)."""
    return np.stack([np.sort(rng.choice(n_comp, size=min(keep, n_comp), replace=False)) for _ in range(n_tokens)])


def attention_call(kind, shape, rng):
    """(args, reference) for one attention unit.  kind: decode_heads, decode_raw_batch,
    decode_mixed_batch, indexed, prefill_raw, prefill_static, prefill_masked."""
    from porter.spec import In, Out

    d = dict(shape.dims)
    nh, hd = d.get("n_head", A.N_HEAD), d.get("head_dim", D)
    nt = d.get("n_tokens", 1)
    m, off, _ = sinks_map(rng, d.get("sink_heads", nh))
    shift = d.get("score_shift", 0.0)
    u = _shift_direction(rng, hd) if shift else None
    if shift:  # q = a*u + noise with a*|u|^2 / sqrt(hd) = shift; every KV row = u + N(0, 0.2^2)
        a = shift / np.sqrt(hd)
        q = A.f16_round(a * u[None, None, :] + 0.3 * rng.standard_normal((nt, nh, hd)))
        kv_kw = {"scale": _SHIFT_NOISE, "base": u}
    else:
        q = q_rows(rng, (nt, nh, hd))
        kv_kw = {}
    out_shape = (nh, hd) if kind == "decode_heads" else (nt, nh, hd)
    args = {"heads": Out("f32", out_shape), "model_map": m, "model_size": m.size, "sinks_offset": off,
            "q": In(q[0] if kind == "decode_heads" else q), "n_head": nh, "head_dim": hd}
    n_comp = d.get("n_comp", 0)
    comp = kv_rows(rng, max(n_comp, 1), hd, **kv_kw)
    if kind.startswith("prefill"):
        raw = kv_rows(rng, nt, hd, **kv_kw)
        args.update(raw_kv=In(raw), n_tokens=nt, window=d["window"])
        mask = None
        if kind != "prefill_raw":
            args.update(comp_kv=In(comp), n_comp=n_comp, ratio=d["ratio"])
        if kind == "prefill_masked":
            mask = np.zeros((nt, max(n_comp, 1)), np.float32)
            if n_comp:
                sel = _selection(rng, nt, n_comp, d["keep"])
                mask[:] = NEG_INF
                np.put_along_axis(mask, sel, 0.0, axis=1)
            args["comp_mask"] = In(mask)
        if shape.expect == "error":
            return args, None
        ref = A.attention_prefill(m.array, off, q, raw, comp if n_comp else None, mask, nt, n_comp, d["window"],
                                  d.get("ratio", 1), nh, hd)
        return args, ref

    cap, n_raw, start, pos0 = d["raw_cap"], d["n_raw"], d["raw_start"], d.get("pos0", 0)
    raw = kv_rows(rng, cap, hd, **kv_kw)
    args.update(raw_kv=In(raw), n_raw=n_raw, raw_cap=cap, raw_start=start)
    if kind == "decode_heads":
        use = d.get("use_mask", 0)
        mask = np.zeros(max(n_comp, 1), np.float32)
        if use and n_comp:
            mask[:] = NEG_INF
            mask[_selection(rng, 1, n_comp, d["keep"])[0]] = 0.0
        args.update(comp_kv=In(comp), n_comp=n_comp, comp_mask=In(mask), use_mask=use)
        if shape.expect == "error":
            return args, None
        return args, A.attention_decode_heads(m.array, off, q[0], raw, n_raw, cap, start, comp, n_comp, mask, use,
                                              nh, hd)
    args.update(n_tokens=nt, pos0=pos0, window=d["window"])
    if kind == "decode_raw_batch":
        if shape.expect == "error":
            return args, None
        return args, A.attention_decode_raw_batch_heads(m.array, off, q, raw, nt, pos0, n_raw, cap, start,
                                                        d["window"], nh, hd)
    args.update(comp_kv=In(comp), n_comp=n_comp, ratio=d["ratio"])
    if kind == "decode_mixed_batch":
        use = d.get("use_mask", 0)
        mask = np.zeros((nt, max(n_comp, 1)), np.float32)
        if use and n_comp:
            mask[:] = NEG_INF
            np.put_along_axis(mask, _selection(rng, nt, n_comp, d["keep"]), 0.0, axis=1)
        args.update(comp_mask=In(mask), use_comp_mask=use)
        if shape.expect == "error":
            return args, None
        return args, A.attention_decode_mixed_batch_heads(m.array, off, q, raw, comp, mask, use, nt, pos0, n_raw,
                                                          cap, start, n_comp, d["window"], d["ratio"], nh, hd)
    # indexed: what ds4's indexer hands over -- per token the top_k of n_comp scores (top_k <=
    # n_comp), rows not yet visible scoring -inf: with at least top_k visible rows the
    # selection is top_k of them, in score order; with fewer, every visible row and then
    # the first invisible ones (equal -inf scores rank the lower index first).
    top_k = d["top_k"]
    sel = np.zeros((nt, top_k), np.int32)
    for t in range(nt):
        vis = min(n_comp, (pos0 + t + 1) // d["ratio"]) if d["ratio"] else n_comp
        if vis >= top_k:
            sel[t] = rng.choice(vis, size=top_k, replace=False)
        elif top_k <= n_comp:
            sel[t] = np.concatenate([rng.permutation(vis), np.arange(vis, top_k)])
    args.update(topk=In(sel), top_k=top_k)
    if shape.expect == "error":
        return args, None
    return args, A.attention_indexed_mixed_batch_heads(m.array, off, q, raw, comp, sel, nt, pos0, n_raw, cap, start,
                                                       n_comp, top_k, d["window"], d["ratio"], nh, hd)


def attention_bytes(s):
    d = s.dims
    nt, nh, hd = d.get("n_tokens", 1), d.get("n_head", A.N_HEAD), d.get("head_dim", D)
    rows = d.get("n_raw", nt) + min(d.get("n_comp", 0), d.get("top_k", d.get("n_comp", 0)) or 0)
    return 4 * (2 * nt * nh * hd + rows * hd + nh)


ATTN_TOL = dict(nmse=1e-6, max_err_rms=1e-2)


# ---------------------------------------------------------------------------
# compressor (every entry point: one builder)
# ---------------------------------------------------------------------------

# ds4's compressed layers rotate with YaRN (reference.ds4_ops constants)
YARN = {"n_ctx_orig": _ops.ROPE_ORIG_CTX, "freq_base": _ops.COMPRESS_ROPE_FREQ_BASE,
        "freq_scale": 1.0 / _ops.ROPE_SCALE_FACTOR, "ext_factor": 1.0,
        "attn_factor": 1.0 / (1.0 + 0.1 * _math.log(_ops.ROPE_SCALE_FACTOR)),
        "beta_fast": _ops.ROPE_YARN_BETA_FAST, "beta_slow": _ops.ROPE_YARN_BETA_SLOW}
ROPE_KEYS = ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow")


def compressor_map(rng, width, ratio, head_dim, ape_type):
    """(Map, ape_offset, norm_offset): the APE table [ratio][width] (F16 or F32) and the F32 norm weight."""
    ape = (rng.standard_normal((ratio, width)) * 0.7).astype(np.float32)
    ape = ape.astype(np.float16) if ape_type == 1 else ape
    norm = rng.uniform(0.5, 1.5, head_dim).astype(np.float32)
    m, (a_off, n_off) = Context.synthetic_map([ape, norm], rng)
    return m, a_off, n_off


COMPRESSOR_INPUTS = ("token kv ~ N(0, 1), scores ~ N(0, 2^2) plus APE ~ N(0, 0.7^2) (F16 or F32); state rows "
                     "alike, cleared rows kv 0 / score -inf; norm weight ~ U(0.5, 1.5); edge: every score "
                     "shifted by +150")

# Every pooling score shifted by +150: the per-dimension softmax over a window's rows is shift-
# invariant, but expf(150) overflows float32.  Upstream's compressor pool kernels take
# expf(score - max_s) over the window (ds4_cuda.cu compressor_*_pool / update_pool).
COMPRESSOR_SCORE_SHIFT = 150.0
EDGE_COMPRESSOR_SHIFT = "pooling scores shifted by +150 (expf overflows without the window max)"


def compressor_state(rng, ratio, width, cleared=(), score_shift=0.0):
    """A state in use: finite kv and scores (scores already hold their APE), rows in `cleared` empty."""
    rows = (2 if ratio == 4 else 1) * ratio
    kv = rng.standard_normal((rows, width)).astype(np.float32)
    sc = (rng.standard_normal((rows, width)) * 2.0 + score_shift).astype(np.float32)
    for r in cleared:
        kv[r], sc[r] = 0.0, -np.inf
    return kv, sc


def compressor_tokens(rng, n, width, score_shift=0.0):
    return (rng.standard_normal((n, width)).astype(np.float32),
            (rng.standard_normal((n, width)) * 2.0 + score_shift).astype(np.float32))


def compressor_bytes(kind):
    """bytes_moved for a compressor unit: what a call must at least read and write once.

    store: the tokens' kv and score rows in, the same rows into the state.
    update: one token in and stored; on an emitted row the whole state read (pool),
    the row written and, on ratio 4, the 4-row shift written.
    prefill / replay: the tokens in, the rows out, the state written."""
    def moved(s):
        d = s.dims
        hd, ratio = d["head_dim"], d.get("ratio", 4)
        width = (2 if ratio == 4 else 1) * hd
        state = (2 if ratio == 4 else 1) * ratio * width
        n = d.get("n_tokens", 1)
        if kind == "store":
            return 4 * 4 * n * width
        if kind == "update":
            emit = (d["pos"] + 1) % ratio == 0
            return 4 * (4 * width + (2 * state + hd + (2 * 4 * width if ratio == 4 else 0) if emit else 0))
        return 4 * (2 * n * width + (n // ratio) * hd + 2 * state)
    return moved
