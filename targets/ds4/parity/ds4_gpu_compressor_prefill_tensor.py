"""Parity spec: ds4_gpu_compressor_prefill_tensor (a fresh prompt's tokens pos0.. through
the compressor at once: the n_tokens / ratio rows the streaming compressor emits --
pooled, RMS-normed, tail-RoPE'd (YaRN) at their windows' first positions, FP8
round-tripped when quantize_fp8 -- into comp_cache rows 0.., and the state a
decode continues from: on ratio 4 rows 0..3 = the last whole window, rows
4..4+rem-1 = the rem tokens after it, the rest empty (kv 0, score -inf); on ratio
128 rows 0..rem-1 = the rem tokens, the rest empty.  The state's previous
contents do not matter (a fresh prompt).

The reference runs ds4.c's token-by-token compressor from an empty state and
then clears the rows as compressor_finish_prefill_state_cpu does; the test file
derives the same rows window by window.  pos0 is a multiple of ratio (windows
are aligned to positions).  Shapes: both ratios, a token count below one
window, exact windows, remainders, the indexer lane, FP8 on and off, odd sizes.

Tolerance: states bit-exact; rows as compressor_update (NMSE 1e-5, max
element 0.5 of the RMS: one FP8 step may flip where a last-bit difference meets
a rounding boundary, and an FP8 case has at least 64 rows, so that stays under
NMSE 6e-6; skipping the FP8 round trip is NMSE ~1e-3)."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")


def build(shape, ctx, rng):
    d = shape.dims
    hd, ratio, n, pos0, ape_type = d["head_dim"], d["ratio"], d["n_tokens"], d["pos0"], d["ape_type"]
    width = (2 if ratio == 4 else 1) * hd
    m, a_off, n_off = I.compressor_map(rng, width, max(ratio, 1), hd, ape_type)
    kv, sc = I.compressor_tokens(rng, n, width, d.get("score_shift", 0.0))
    skv, ssc = I.compressor_state(rng, max(ratio, 1), width)  # garbage: a fresh prompt ignores it
    n_comp = n // max(ratio, 1)
    cache = rng.standard_normal((max(n_comp, 1) + 2, hd)).astype(np.float32)
    rope = I.YARN
    args = {"comp_cache": InOut(cache), "state_kv": InOut(skv), "state_score": InOut(ssc), "kv": In(kv),
            "sc": In(sc), "model_map": m, "model_size": m.size, "ape_offset": a_off, "ape_type": ape_type,
            "norm_offset": n_off, "norm_type": d.get("norm_type", 0), "head_dim": hd, "ratio": ratio, "pos0": pos0,
            "n_tokens": n, "n_rot": d["n_rot"], "n_ctx_orig": rope["n_ctx_orig"], "quantize_fp8": d["fp8"],
            **{k: rope[k] for k in I.ROPE_KEYS}, "rms_eps": 1e-6}
    if shape.expect == "error":
        return Call(args=args)
    rc, rkv, rsc = A.compressor_prefill(cache, skv, ssc, kv, sc, m.array, a_off, ape_type, n_off, 0, hd, ratio, pos0,
                                        n, d["n_rot"], rope["n_ctx_orig"], d["fp8"],
                                        *(rope[k] for k in I.ROPE_KEYS), 1e-6)
    return Call(args=args, expect={"comp_cache": rc, "state_kv": rkv, "state_score": rsc})


def dims(n_tokens, ratio=4, pos0=0, head_dim=512, fp8=False, n_rot=64, ape_type=1, **kw):
    return {"n_tokens": n_tokens, "ratio": ratio, "pos0": pos0, "head_dim": head_dim, "fp8": fp8, "n_rot": n_rot,
            "ape_type": ape_type, **kw}


R4 = "ratio 4: 37 tokens -> 9 rows, 1 token left"
R128 = "ratio 128: 300 tokens -> 2 rows, 44 left"
FP8 = "ratio 4, FP8: 258 tokens -> 64 rows, 2 left"
FEW = "ratio 4: 3 tokens, no row yet"
DISPATCH = {
    "compressor_set_rows_kernel (previous window)": f"ratio 4 with a whole window -> reached by shape '{R4}'",
    "compressor_set_rows_kernel (remainder)": f"rem != 0 -> reached by shape '{R128}'",
    "compressor_prefill_pool_kernel (ratio 4 overlap)": f"ratio 4 -> reached by shape '{R4}'",
    "compressor_prefill_pool_kernel (ratio 128)": f"other ratios -> reached by shape '{R128}'",
    "rms_norm_weight_kernel + rope_tail_kernel": f"n_comp > 0 -> reached by shape '{R4}'",
    "fp8_kv_quantize_kernel": f"quantize_fp8 -> reached by shape '{FP8}'",
    "state only (no pool)": f"n_tokens < ratio -> reached by shape '{FEW}'",
}
# ratio 128 with no token left: every state row is empty (kv 0), so the right state_kv is all zero.  The
# state comes in holding garbage, so a kernel that skips clearing it still fails the exact check.
NONE_LEFT = "ratio 128, no token left: every state row is empty, state_kv is all zero"
EXACT = Tol(nmse=None, max_err_rms=None, max_abs=0.0)
ROW_TOL = Tol(nmse=1e-5, max_err_rms=0.5)

SPEC = UnitSpec(
    unit="ds4_gpu_compressor_prefill_tensor",
    reference="reference.ds4_attention_ops.compressor_prefill",
    inputs=I.COMPRESSOR_INPUTS,
    outputs={"comp_cache": ROW_TOL, "state_kv": EXACT, "state_score": EXACT},
    shapes=[
        Shape(FEW, dims(3)),
        Shape("ratio 4: 4 tokens -> 1 row (no previous half)", dims(4)),
        Shape(R4, dims(37)),
        Shape("ratio 4 at 512: 64 tokens -> 16 rows (F32 APE)", dims(64, pos0=512, ape_type=0)),
        Shape(R128, dims(300, ratio=128)),
        Shape("ratio 4: 37 tokens -> 9 rows, scores +150", dims(37, score_shift=I.COMPRESSOR_SCORE_SHIFT), edge=I.EDGE_COMPRESSOR_SHIFT),
        Shape("ratio 128: 300 tokens -> 2 rows, scores +150",
              dims(300, ratio=128, score_shift=I.COMPRESSOR_SCORE_SHIFT), edge=I.EDGE_COMPRESSOR_SHIFT),
        Shape("ratio 128: 256 tokens -> 2 rows, none left", dims(256, ratio=128), zero_answer=NONE_LEFT),
        Shape(FP8, dims(258, fp8=True)),
        Shape("ratio 128, FP8: 8192 tokens -> 64 rows", dims(8192, ratio=128, fp8=True), zero_answer=NONE_LEFT),
        Shape("indexer lane: 128 wide, ratio 4, 130 tokens -> 32 rows", dims(130, head_dim=128)),
        Shape("odd: 96 wide, ratio 3, n_rot 32, 20 tokens -> 6 rows", dims(20, ratio=3, head_dim=96, n_rot=32)),
        # untimed since the 2048-token chunk below times the same path at the size ds4 calls
        Shape("prefill, ratio 4, FP8: 1024 tokens -> 256 rows", dims(1024, fp8=True)),
        # a fresh prompt's first chunk at ds4's working batch (ds4.c prefills in chunks of 2048 tokens)
        Shape("prefill chunk, ratio 4, FP8: 2048 tokens -> 512 rows (timing)", dims(2048, fp8=True), timed=True),
        Shape("prefill chunk, ratio 128, FP8: 2048 tokens -> 16 rows (timing)", dims(2048, ratio=128, fp8=True),
              zero_answer=NONE_LEFT, timed=True),
        Shape("error: odd n_rot", dims(8, n_rot=63), expect="error", why="RoPE rotates pairs"),
        Shape("error: norm_type 1", dims(8, norm_type=1), expect="error", why="the norm weight is F32"),
    ],
    build=build,
    bytes_moved=I.compressor_bytes("prefill"),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
