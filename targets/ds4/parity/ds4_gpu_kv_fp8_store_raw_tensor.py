"""Parity spec: ds4_gpu_kv_fp8_store_raw_tensor (decode's KV step: the token's KV row
gets the FP8 round trip in place -- non-RoPE part, blocks of 64 -- and the
quantized row, rounded to f16, goes to ring row `row % raw_cap`).

Both outputs are compared: kv (the quantized row, used again by the caller)
and the ring.  Shapes: ds4's 512-wide row with a 64-wide tail, a wrapped
position, odd widths and tails.

Tolerance: bit-exact (see dsv4_fp8_kv_quantize and store_raw_kv)."""
import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec
from reference import ds4_attention_ops as A


def build(shape, ctx, rng):
    d = shape.dims
    cap, hd, n_rot = d["raw_cap"], d["head_dim"], d["n_rot"]
    cache = A.f16_round(rng.standard_normal((cap, hd)))
    kv = (rng.standard_normal(hd) * d.get("scale", 1.0)).astype(np.float32)
    args = {"kv": InOut(kv), "raw_cache": InOut(cache), "raw_cap": cap, "row": d["row"], "head_dim": hd,
            "n_rot": n_rot}
    if shape.expect == "error":
        return Call(args=args)
    kq, ring = A.kv_fp8_store_raw(kv, cache, cap, d["row"], hd, n_rot)
    return Call(args=args, expect={"kv": kq, "raw_cache": ring})


def dims(row, raw_cap=A.N_SWA, head_dim=A.HEAD_DIM, n_rot=A.N_ROT, **kw):
    return {"row": row, "raw_cap": raw_cap, "head_dim": head_dim, "n_rot": n_rot, **kw}


DECODE = "decode: position 300 of a 128 x 512 ring (timing)"
DISPATCH = {
    "fp8_kv_quantize_kernel": f"first step, always -> reached by shape '{DECODE}'",
    "store_raw_kv_batch_kernel": f"second step, always -> reached by shape '{DECODE}'",
}

SPEC = UnitSpec(
    unit="ds4_gpu_kv_fp8_store_raw_tensor",
    reference="reference.ds4_attention_ops.kv_fp8_store_raw",
    inputs="KV row ~ N(0, s^2); cache of f16-rounded N(0, 1) rows",
    outputs={"kv": Tol(nmse=None, max_err_rms=None, max_abs=0.0),
             "raw_cache": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape(DECODE, dims(300), timed=True),
        Shape("position 0, values ~100 (FP8 steps well above f16's)", dims(0, scale=100.0)),
        Shape("position 128 wraps to ring row 0", dims(128)),
        Shape("odd: head_dim 192, n_rot 64, ring of 5, position 9", dims(9, 5, 192, 64)),
        Shape("odd: head_dim 128, n_rot 0", dims(3, 4, 128, 0)),
        Shape("error: n_rot > head_dim", dims(0, head_dim=64, n_rot=128), expect="error",
              why="the tail cannot exceed the row"),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["head_dim"],
)
