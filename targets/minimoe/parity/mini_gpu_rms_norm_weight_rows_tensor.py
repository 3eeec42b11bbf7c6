"""Parity spec: mini_gpu_rms_norm_weight_rows_tensor (plain RMS norm times an F32 weight
read from the model map).  Real cases use the fixture's norm weights at their
offsets in the real GGUF; synthetic ones an odd n, another eps and a weight
surrounded by random bytes.

GGUF aligns its tensors, but mini_gpu.h takes any byte offset: weights at
offsets 1 and 2 past a multiple of 4 reach the path a kernel takes for a
weight it cannot read as aligned float32 (the known-good assembles each value
from its 4 bytes there).  A weight whose last value lies past model_size is a
bad argument (mini_gpu.h: non-zero on bad arguments; every backend checks the
whole n * 4 bytes against the map).  Rows of one value (n = 1) are a valid
norm, and a call with no rows has nothing to do: the Metal backend returns 0
for it once its tensors and the weight hold (mini_metal.m)."""
import numpy as np

from porter.spec import Call, Context, In, Out, Shape, SpecError, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

E = sibling(__file__, "_edges")
sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    rows, eps = d["rows"], d["eps"]
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        if t.qtype != "F32" or len(t.shape) != 1:
            raise SpecError(f"{t.name} is {t.qtype} {t.shape}, expected an F32 vector")
        m, off, n = ctx.fixture_map(), t.offset, t.shape[0]
    else:
        n = d["n"]
        w = (1.0 + 0.3 * rng.standard_normal(n)).astype("<f4")
        # misalign: the weight at 160 + misalign bytes, not a multiple of 4 (any byte offset is the API's)
        mis = d.get("misalign", 0)
        m, (off,) = Context.synthetic_map([w], rng, lead=160 + mis, align=1 if mis else 32)
    x = E.norm_rows(rng, rows, n, d.get("lo", 0.1), d.get("hi", 10.0), d.get("near_zero", False))
    # short_map: model_size ends 4 bytes before the weight does (its last value outside the map; the map's
    # array stays whole, so a backend that reads it anyway reads bytes the harness owns)
    size = off + 4 * n - 4 if d.get("short_map") else m.size
    args = {"out": Out("f32", (rows, n)), "x": In(x), "model_map": m, "model_size": size,
            "weight_offset": off, "n": n, "n_rows": rows, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ops.rms_norm_weight_rows(x, m.array, off, n, rows, eps)})


BASE = Shape("odd n=257 x 3 rows", {"n": 257, "rows": 3, "eps": 1e-6})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_rms_norm_weight_rows_tensor",
    reference="reference.minimoe_ops.rms_norm_weight_rows",
    inputs=E.NORM_INPUTS,
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("attn_norm, 1 token", {"rows": 1, "eps": 1e-6}, source="fixture:blk.0.attn_norm.weight"),
        Shape("ffn_norm, 3 tokens", {"rows": 3, "eps": 1e-6}, source="fixture:blk.1.ffn_norm.weight"),
        Shape("attn_norm, 7 tokens", {"rows": 7, "eps": 1e-6}, source="fixture:blk.1.attn_norm.weight"),
        Shape("output_norm, last row", {"rows": 1, "eps": 1e-6}, source="fixture:output_norm.weight"),
        Shape("odd n=96 x 5 rows, eps 1e-3, small x", {"n": 96, "rows": 5, "eps": 1e-3, "lo": 0.02, "hi": 0.05}),
        BASE,
        Shape("near zero: attn_norm, 7 tokens", {"rows": 7, "eps": 1e-6, "near_zero": True},
              source="fixture:blk.1.attn_norm.weight", edge=E.EDGE_NEAR_ZERO),
        Shape("odd n=257 x 3 rows, weight at a map offset 1 past a multiple of 4",
              {"n": 257, "rows": 3, "eps": 1e-6, "misalign": 1}),
        Shape("n=96 x 4 rows, weight at a map offset 2 past a multiple of 4",
              {"n": 96, "rows": 4, "eps": 1e-6, "misalign": 2}),
        Shape("n=1 x 5 rows (one value a row: about its sign, times the weight)", {"n": 1, "rows": 5, "eps": 1e-6}),
        Shape("no rows (n=96): nothing to do, success", {"n": 96, "rows": 0, "eps": 1e-6},
              zero_answer="no rows: an empty output, which any answer matches; the return code is the check"),
        Shape("error: the weight's last value past model_size", {"n": 257, "rows": 3, "eps": 1e-6, "short_map": True},
              expect="error", why="the weight's n * 4 bytes must lie inside the model map (a bad argument)"),
        Shape("ffn_norm, 2048 tokens (bandwidth)", {"rows": 2048, "eps": 1e-6}, source="fixture:blk.0.ffn_norm.weight",
              timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 8 * 256 * s.dims["rows"] + 4 * 256,
)
