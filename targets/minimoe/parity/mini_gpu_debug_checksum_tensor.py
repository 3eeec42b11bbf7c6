"""Parity spec: mini_gpu_debug_checksum_tensor  ([sum x, sum x^2] as float32).

The header fixes no summation order, so the bound allows any reasonable
float32 order (a pairwise/tree sum is ~1e-7 relative; a naive serial sum of
65537 values can be ~1e-3 off and is rejected).  Values are positive so the
sum does not cancel."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    n = shape.dims["n"]
    x = rng.uniform(0.0, 1.0, n).astype(np.float32)
    return Call(args={"checksum": Out("f32", (2,)), "x": In(x), "n": n}, expect={"checksum": ops.debug_checksum(x, n)})


BASE = Shape("n=7", {"n": 7})  # not n=0: an empty sum returns before its data checks
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("checksum", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_debug_checksum_tensor",
    reference="reference.minimoe_ops.debug_checksum",
    inputs="x ~ N(0, 1)",
    outputs={"checksum": Tol(nmse=1e-8, max_err_rms=1e-4)},
    shapes=[
        Shape("n=0 (zeros)", {"n": 0}, zero_answer="the checksum of no elements is (0, 0)"),
        Shape("n=1", {"n": 1}),
        BASE,
        Shape("n=1000", {"n": 1000}),
        Shape("n=65537 (bandwidth)", {"n": 65537}, timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 4 * s.dims["n"],
)
