"""Parity spec: mini_gpu_add_tensor  (out[i] = a[i] + b[i]; out may alias a).

float32 a + b is one correctly rounded operation, so the result must be
bit-exact.  One case passes the same tensor as `out` and `a`, as the engine does
for the residual stream."""
import numpy as np

from porter.spec import Call, In, InOut, Out, Same, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    n = shape.dims["n"]
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 0.5).astype(np.float32)
    ref = ops.add(a, b, n)
    if shape.dims.get("alias"):
        return Call(args={"out": Same("a"), "a": InOut(a), "b": In(b), "n": n}, expect={"out": ref})
    return Call(args={"out": Out("f32", (n,)), "a": In(a), "b": In(b), "n": n}, expect={"out": ref})


BASE = Shape("n=7", {"n": 7})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "a", "b"))

SPEC = UnitSpec(
    unit="mini_gpu_add_tensor",
    reference="reference.minimoe_ops.add",
    inputs="a, b ~ N(0, 1)",
    outputs={"out": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape("n=1", {"n": 1}),
        BASE,
        Shape("n=1792 (7 tokens x n_embd 256)", {"n": 7 * 256}),
        Shape("n=768 out aliases a (residual in place)", {"n": 3 * 256, "alias": True}),
        Shape("n=2^20+5 (bandwidth)", {"n": (1 << 20) + 5}, timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 12 * s.dims["n"],
)
