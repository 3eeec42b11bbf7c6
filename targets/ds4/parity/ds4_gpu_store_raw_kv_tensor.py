"""Parity spec: ds4_gpu_store_raw_kv_tensor (one KV row, rounded to f16, into the raw
sliding-window ring at ring row `row % raw_cap`; every other ring row unchanged).

ds4's raw cache is a ring of 128 rows (DS4_N_SWA) x 512; decode writes the new
token's row at its position.  `row` is a position: the shapes write the first
and last ring rows, a position that wraps (128 -> row 0) and one far into the
context, a ring of one row, and an odd width.  The cache holds stale rows that
must survive.  kv values are random float32 (not f16 already), so a store that
skips the f16 rounding is caught.

Tolerance: bit-exact (round to nearest even to f16 and back is exact)."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A


def build(shape, ctx, rng):
    d = shape.dims
    cap, hd = d["raw_cap"], d["head_dim"]
    cache = A.f16_round(rng.standard_normal((d.get("cache_rows", cap), hd)))
    kv = rng.standard_normal(hd).astype(np.float32)
    args = {"raw_cache": InOut(cache), "kv": In(kv), "raw_cap": cap, "row": d["row"], "head_dim": hd}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"raw_cache": A.store_raw_kv(cache, kv, cap, d["row"], hd)})


def dims(row, raw_cap=A.N_SWA, head_dim=A.HEAD_DIM, **kw):
    return {"row": row, "raw_cap": raw_cap, "head_dim": head_dim, **kw}


DECODE = "decode: position 77 of a 128 x 512 ring (timing)"
DISPATCH = {
    "store_raw_kv_batch_kernel": f"the only path (one row) -> reached by shape '{DECODE}'",
}

SPEC = UnitSpec(
    unit="ds4_gpu_store_raw_kv_tensor",
    reference="reference.ds4_attention_ops.store_raw_kv",
    inputs="KV row ~ N(0, 1); cache of f16-rounded N(0, 1) rows",
    outputs={"raw_cache": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape(DECODE, dims(77), timed=True),
        Shape("position 0", dims(0)),
        Shape("position 127: last ring row", dims(127)),
        Shape("position 128 wraps to ring row 0", dims(128)),
        Shape("position 70001 (ring row 113)", dims(70001)),
        Shape("ring of one row", dims(5, raw_cap=1)),
        Shape("odd: head_dim 96, ring of 7, position 20", dims(20, 7, 96)),
        Shape("error: raw_cap 0", dims(0, raw_cap=0, cache_rows=4), expect="error", why="an empty ring"),
        Shape("error: cache shorter than raw_cap rows", dims(3, raw_cap=128, cache_rows=127), expect="error",
              why="raw_cache must hold raw_cap rows"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["head_dim"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
