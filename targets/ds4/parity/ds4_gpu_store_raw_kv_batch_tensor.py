"""Parity spec: ds4_gpu_store_raw_kv_batch_tensor (n_tokens KV rows, each rounded to f16,
into the raw ring: token t at ring row (pos0 + t) % raw_cap; other rows unchanged).

Prefill stores a chunk's rows, decode batches a few.  Shapes: a batch that
wraps the ring's end, one that fills the ring exactly, pos0 0 and far into the
context, odd widths whose row count x width is not a multiple of the launch
block.  Batches longer than the ring are left out: upstream writes such a
batch's colliding rows concurrently (which one lands is unordered), and ds4's
engine never stores more rows than the ring holds in one call.

Tolerance: bit-exact."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A


def build(shape, ctx, rng):
    d = shape.dims
    cap, hd, n = d["raw_cap"], d["head_dim"], d["n_tokens"]
    cache = A.f16_round(rng.standard_normal((d.get("cache_rows", cap), hd)))
    kv = rng.standard_normal((d.get("kv_rows", n), hd)).astype(np.float32)
    args = {"raw_cache": InOut(cache), "kv": In(kv), "raw_cap": cap, "pos0": d["pos0"], "n_tokens": n,
            "head_dim": hd}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"raw_cache": A.store_raw_kv_batch(cache, kv, cap, d["pos0"], n, hd)})


def dims(n_tokens, pos0, raw_cap=A.N_SWA, head_dim=A.HEAD_DIM, **kw):
    return {"n_tokens": n_tokens, "pos0": pos0, "raw_cap": raw_cap, "head_dim": head_dim, **kw}


PREFILL = "prefill: 128 rows at 0 fill the ring"
DISPATCH = {
    "store_raw_kv_batch_kernel": f"the only path -> reached by shape '{PREFILL}'",
}

SPEC = UnitSpec(
    unit="ds4_gpu_store_raw_kv_batch_tensor",
    reference="reference.ds4_attention_ops.store_raw_kv_batch",
    inputs="KV rows ~ N(0, 1); cache of f16-rounded N(0, 1) rows",
    outputs={"raw_cache": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        # untimed since the 2048-row chunk below times the same kernel at the size ds4 calls
        Shape(PREFILL, dims(128, 0)),
        # ds4.c's prefill chunk: 2048 rows into the prefill ring (metal_graph_raw_cap_for_context: 128 + 2048
        # rounded up to 256 = 2304 rows), a later chunk's wrapping past the ring's end
        Shape("prefill chunk: 2048 rows at 2048 in a ring of 2304 (timing)", dims(2048, 2048, raw_cap=2304),
              timed=True),
        Shape("decode batch: 3 rows at 4097", dims(3, 4097)),
        Shape("10 rows at 123 wrap the ring's end", dims(10, 123)),
        Shape("1 row at 0", dims(1, 0)),
        Shape("odd: head_dim 96, 3 rows at 5 in a ring of 7 (288 values: block tail)", dims(3, 5, 7, 96)),
        Shape("odd: head_dim 33, 7 rows at 1 in a ring of 7", dims(7, 1, 7, 33)),
        Shape("error: raw_cap 0", dims(1, 0, raw_cap=0, cache_rows=2), expect="error", why="an empty ring"),
        Shape("error: kv shorter than n_tokens rows", dims(4, 0, kv_rows=3), expect="error",
              why="kv must hold n_tokens rows"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_tokens"] * s.dims["head_dim"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
