"""Parity spec: mini_gpu_rms_norm_weight_rows_tensor (plain RMS norm times an F32 weight
read from the model map).  Real cases use the fixture's norm weights at their
offsets in the real GGUF; synthetic ones an odd n, another eps and a weight
surrounded by random bytes."""
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
        m, (off,) = Context.synthetic_map([w], rng)
    x = E.norm_rows(rng, rows, n, d.get("lo", 0.1), d.get("hi", 10.0), d.get("near_zero", False))
    return Call(
        args={"out": Out("f32", (rows, n)), "x": In(x), "model_map": m, "model_size": m.size,
              "weight_offset": off, "n": n, "n_rows": rows, "eps": eps},
        expect={"out": ops.rms_norm_weight_rows(x, m.array, off, n, rows, eps)},
    )


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
        Shape("ffn_norm, 2048 tokens (bandwidth)", {"rows": 2048, "eps": 1e-6}, source="fixture:blk.0.ffn_norm.weight",
              timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 8 * 256 * s.dims["rows"] + 4 * 256,
)
