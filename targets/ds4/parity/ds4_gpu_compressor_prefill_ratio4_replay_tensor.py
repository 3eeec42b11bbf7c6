"""Parity spec: ds4_gpu_compressor_prefill_ratio4_replay_tensor (a ratio-4 prefill chunk that
CONTINUES a prompt: n_tokens whole windows from pos0 (both multiples of 4), the
first window's previous half taken from the given state's rows 0..3 -- the
previous chunk's last window --, then as compressor_prefill: rows out, and the
state left with rows 0..3 = this chunk's last window, rows 4..7 empty).

This is where the ratio-4 overlap crosses a chunk boundary: an
implementation that starts each chunk from an empty previous half gets row 0
of every chunk wrong.  Shapes: one window, many, the indexer lane, FP8 on
and off, odd widths; n_tokens or pos0 not a multiple of 4 is refused.

Tolerance: as compressor_prefill."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")


def build(shape, ctx, rng):
    d = shape.dims
    hd, n, pos0, ape_type = d["head_dim"], d["n_tokens"], d["pos0"], d["ape_type"]
    width = 2 * hd
    m, a_off, n_off = I.compressor_map(rng, width, 4, hd, ape_type)
    kv, sc = I.compressor_tokens(rng, n, width)
    skv, ssc = I.compressor_state(rng, 4, width, cleared=(4, 5, 6, 7))  # as a previous prefill left it
    cache = rng.standard_normal((max(n // 4, 1) + 2, hd)).astype(np.float32)
    rope = I.YARN
    args = {"comp_cache": InOut(cache), "state_kv": InOut(skv), "state_score": InOut(ssc), "kv": In(kv),
            "sc": In(sc), "model_map": m, "model_size": m.size, "ape_offset": a_off, "ape_type": ape_type,
            "norm_offset": n_off, "norm_type": 0, "head_dim": hd, "pos0": pos0, "n_tokens": n, "n_rot": d["n_rot"],
            "n_ctx_orig": rope["n_ctx_orig"], "quantize_fp8": d["fp8"], **{k: rope[k] for k in I.ROPE_KEYS},
            "rms_eps": 1e-6}
    if shape.expect == "error":
        return Call(args=args)
    rc, rkv, rsc = A.compressor_prefill_ratio4_replay(cache, skv, ssc, kv, sc, m.array, a_off, ape_type, n_off, 0,
                                                      hd, pos0, n, d["n_rot"], rope["n_ctx_orig"], d["fp8"],
                                                      *(rope[k] for k in I.ROPE_KEYS), 1e-6)
    return Call(args=args, expect={"comp_cache": rc, "state_kv": rkv, "state_score": rsc})


def dims(n_tokens, pos0, head_dim=512, fp8=False, n_rot=64, ape_type=1):
    return {"n_tokens": n_tokens, "pos0": pos0, "head_dim": head_dim, "fp8": fp8, "n_rot": n_rot,
            "ape_type": ape_type}


CHUNK = "chunk: 64 tokens at 2048 -> 16 rows"
DISPATCH = {
    "compressor_prefill_pool_kernel (replay)": f"always; row 0 from the state -> reached by shape '{CHUNK}'",
    "rms_norm_weight_kernel + rope_tail_kernel": f"always -> reached by shape '{CHUNK}'",
    "fp8_kv_quantize_kernel": "quantize_fp8 -> reached by shape 'chunk, FP8: 256 tokens at 512 -> 64 rows'",
    "compressor_set_rows_kernel": f"always (the new state) -> reached by shape '{CHUNK}'",
}
EXACT = Tol(nmse=None, max_err_rms=None, max_abs=0.0)
ROW_TOL = Tol(nmse=1e-5, max_err_rms=0.5)

SPEC = UnitSpec(
    unit="ds4_gpu_compressor_prefill_ratio4_replay_tensor",
    reference="reference.ds4_attention_ops.compressor_prefill_ratio4_replay",
    inputs=I.COMPRESSOR_INPUTS,
    outputs={"comp_cache": ROW_TOL, "state_kv": EXACT, "state_score": EXACT},
    shapes=[
        Shape("one window: 4 tokens at 4096 -> 1 row", dims(4, 4096)),
        Shape(CHUNK, dims(64, 2048)),
        Shape("chunk, FP8: 256 tokens at 512 -> 64 rows", dims(256, 512, fp8=True)),
        Shape("indexer lane: 128 wide, 40 tokens at 128 (F32 APE)", dims(40, 128, head_dim=128, ape_type=0)),
        Shape("odd: 96 wide, n_rot 32, 12 tokens at 8", dims(12, 8, head_dim=96, n_rot=32)),
        Shape("prefill chunk, FP8: 2048 tokens at 2048 -> 512 rows (timing)", dims(2048, 2048, fp8=True),
              timed=True),
        Shape("error: n_tokens not a multiple of 4", dims(6, 8), expect="error", why="replay takes whole windows"),
        Shape("error: pos0 not a multiple of 4", dims(8, 6), expect="error", why="windows are aligned to positions"),
    ],
    build=build,
    bytes_moved=I.compressor_bytes("prefill"),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
