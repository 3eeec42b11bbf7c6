"""Parity spec: ds4_gpu_compressor_update_tensor (one decode token through the streaming
compressor: store it (compressor_store_batch); when its position ends a window,
(pos + 1) % ratio == 0, pool the window with a per-dimension softmax over the
rows' scores -- on ratio-4 layers the previous window's first half (state rows
0..3, columns [0, D)) together with this window's second half (rows 4..7, [D, 2D))
--, RMS-norm it with the F32 weight, tail-RoPE it (YaRN) at the window's first
position pos + 1 - ratio, write it to comp_cache[comp_row], and on ratio 4 copy
this window into both halves of the state).

The FP8 / QAT round trip of the new row is a separate call in the GPU API (ds4.c
does it inside compressor_decode_one).  Shapes: both ratios with and without an
emitted row, the indexer lane (128 wide), the first window after a fresh start
(previous half empty), odd sizes; comp_cache rows other than comp_row must
survive.

Tolerance: states bit-exact; the row: pooling, norm and RoPE in float32 vs
float64 -- NMSE 1e-5, max element 0.5 of the RMS (the bound the compressor
specs share: their FP8 variants can flip one FP8 step).  A dropped overlap half,
a wrong APE phase or RoPE position moves the row by O(1)."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")


def build(shape, ctx, rng):
    d = shape.dims
    hd, ratio, pos, ape_type = d["head_dim"], d["ratio"], d["pos"], d["ape_type"]
    width = (2 if ratio == 4 else 1) * hd
    m, a_off, n_off = I.compressor_map(rng, width, ratio, hd, ape_type)
    shift = d.get("score_shift", 0.0)
    kv, sc = I.compressor_tokens(rng, 1, width, shift)
    skv, ssc = I.compressor_state(rng, ratio, width, cleared=d.get("cleared", ()), score_shift=shift)
    cache = rng.standard_normal((d["cache_rows"], hd)).astype(np.float32)
    rope = {**I.YARN, "n_ctx_orig": I.YARN["n_ctx_orig"]}
    args = {"kv_cur": In(kv), "sc_cur": In(sc), "state_kv": InOut(skv), "state_score": InOut(ssc),
            "comp_cache": InOut(cache), "model_map": m, "model_size": m.size, "ape_offset": a_off,
            "ape_type": ape_type, "norm_offset": n_off, "norm_type": d.get("norm_type", 0), "head_dim": hd, "ratio": ratio, "pos": pos,
            "comp_row": d["comp_row"], "n_rot": d["n_rot"], "n_ctx_orig": rope["n_ctx_orig"],
            **{k: rope[k] for k in I.ROPE_KEYS}, "rms_eps": 1e-6}
    if shape.expect == "error":
        return Call(args=args)
    rkv, rsc, rc = A.compressor_update(kv, sc, skv, ssc, cache, m.array, a_off, ape_type, n_off, 0, hd, ratio, pos,
                                       d["comp_row"], d["n_rot"], rope["n_ctx_orig"],
                                       *(rope[k] for k in I.ROPE_KEYS), 1e-6)
    return Call(args=args, expect={"state_kv": rkv, "state_score": rsc, "comp_cache": rc})


def dims(pos, ratio=4, head_dim=512, comp_row=None, cache_rows=None, n_rot=64, ape_type=1, **kw):
    row = (pos + 1) // ratio - 1 if comp_row is None else comp_row
    row = max(row, 0)
    return {"pos": pos, "ratio": ratio, "head_dim": head_dim, "comp_row": row,
            "cache_rows": row + 3 if cache_rows is None else cache_rows, "n_rot": n_rot, "ape_type": ape_type, **kw}


EMIT4 = "decode, ratio 4: token at 4099 ends a window -> row 1024"
DISPATCH = {
    "compressor_store_kernel": f"always -> reached by shape '{EMIT4}'",
    "compressor_update_pool_kernel": f"(pos + 1) % ratio == 0 -> reached by shape '{EMIT4}'",
    "rms_norm_weight_kernel": f"on an emitted row -> reached by shape '{EMIT4}'",
    "rope_tail_kernel": f"on an emitted row -> reached by shape '{EMIT4}'",
    "compressor_shift_ratio4_kernel": f"ratio 4 after an emitted row -> reached by shape '{EMIT4}'",
}
EXACT = Tol(nmse=None, max_err_rms=None, max_abs=0.0)
ROW_TOL = Tol(nmse=1e-5, max_err_rms=0.5)

SPEC = UnitSpec(
    unit="ds4_gpu_compressor_update_tensor",
    reference="reference.ds4_attention_ops.compressor_update",
    inputs=I.COMPRESSOR_INPUTS,
    outputs={"state_kv": EXACT, "state_score": EXACT, "comp_cache": ROW_TOL},
    shapes=[
        Shape(EMIT4, dims(4099), timed=True),
        Shape("decode, ratio 4: token at 4097, no row", dims(4097, comp_row=5, cache_rows=8)),
        Shape("decode, ratio 4: token at 4099 ends a window, scores +150",
              dims(4099, score_shift=I.COMPRESSOR_SCORE_SHIFT), edge=I.EDGE_COMPRESSOR_SHIFT),
        Shape("decode, ratio 128: token at 65535 ends a window, scores +150",
              dims(65535, ratio=128, ape_type=0, score_shift=I.COMPRESSOR_SCORE_SHIFT), edge=I.EDGE_COMPRESSOR_SHIFT),
        Shape("first window after a fresh start: token at 3, previous half empty",
              dims(3, cleared=(0, 1, 2, 3))),
        Shape("decode, ratio 128: token at 65535 ends a window -> row 511 (F32 APE)", dims(65535, ratio=128,
                                                                                          ape_type=0)),
        Shape("decode, ratio 128: token at 65500, no row", dims(65500, ratio=128, comp_row=3, cache_rows=4)),
        Shape("indexer lane: 128 wide, ratio 4, token at 127 -> row 31", dims(127, head_dim=128)),
        Shape("odd: 96 wide, ratio 3, n_rot 32, token at 29 -> row 9", dims(29, ratio=3, head_dim=96, n_rot=32)),
        Shape("error: ape_type 2", dims(4099, ape_type=2), expect="error", why="APE is F32 (0) or F16 (1)"),
        Shape("error: norm_type 1", dims(4097, comp_row=5, cache_rows=8, norm_type=1), expect="error",
              why="the norm weight is F32"),
        Shape("error: comp_cache too short for the emitted row", dims(4099, cache_rows=1024), expect="error",
              why="comp_row must be inside comp_cache when a row is emitted"),
    ],
    build=build,
    bytes_moved=I.compressor_bytes("update"),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
