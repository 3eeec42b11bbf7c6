"""Parity spec: mini_gpu_rms_norm_plain_rows_tensor (per-row x / sqrt(mean(x^2) + eps)).

The engine uses it on the q and k heads (n = head_dim 64, rows = tokens x heads).
Rows get different scales; one case has rows so small that eps changes the
answer by half (a kernel that ignores eps fails there).  Rows of one value
(n = 1: out = x / sqrt(x^2 + eps), about its sign) are a valid norm a guard
written `n <= 1` refuses, and a call with no rows has nothing to do: the Metal
backend returns 0 for it once its tensors hold (mini_metal.m)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

E = sibling(__file__, "_edges")
sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n, rows, eps = d["n"], d["rows"], d["eps"]
    x = E.norm_rows(rng, rows, n, d.get("lo", 0.1), d.get("hi", 10.0), d.get("near_zero", False))
    return Call(args={"out": Out("f32", (rows, n)), "x": In(x), "n": n, "n_rows": rows, "eps": eps},
                expect={"out": ops.rms_norm_plain_rows(x, n, rows, eps)})


BASE = Shape("odd n=33 x 5 rows", {"n": 33, "rows": 5, "eps": 1e-6})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_rms_norm_plain_rows_tensor",
    reference="reference.minimoe_ops.rms_norm_plain_rows",
    inputs=E.NORM_INPUTS,
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("q heads, 1 token (64 x 4 rows)", {"n": 64, "rows": 4, "eps": 1e-6}),
        Shape("k head, 3 tokens (64 x 3 rows)", {"n": 64, "rows": 3, "eps": 1e-6}),
        Shape("q heads, 7 tokens (64 x 28 rows)", {"n": 64, "rows": 28, "eps": 1e-6}),
        BASE,
        Shape("n=7 x 1 row", {"n": 7, "rows": 1, "eps": 1e-6}),
        Shape("n=1000 x 3 rows", {"n": 1000, "rows": 3, "eps": 1e-6}),
        Shape("n=1 x 5 rows (one value a row: about its sign)", {"n": 1, "rows": 5, "eps": 1e-6}),
        Shape("near zero: q heads, 7 tokens (64 x 28 rows)", {"n": 64, "rows": 28, "eps": 1e-6, "near_zero": True},
              edge=E.EDGE_NEAR_ZERO),
        Shape("near zero: n=7 x 1 row", {"n": 7, "rows": 1, "eps": 1e-6, "near_zero": True}, edge=E.EDGE_NEAR_ZERO),
        Shape("eps matters (x ~ 0.03, eps 1e-3)", {"n": 64, "rows": 9, "eps": 1e-3, "lo": 0.02, "hi": 0.05}),
        Shape("no rows (n=64): nothing to do, success", {"n": 64, "rows": 0, "eps": 1e-6},
              zero_answer="no rows: an empty output, which any answer matches; the return code is the check"),
        Shape("q heads, 2048 tokens (bandwidth)", {"n": 64, "rows": 8192, "eps": 1e-6}, timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 8 * s.dims["n"] * s.dims["rows"],
)
