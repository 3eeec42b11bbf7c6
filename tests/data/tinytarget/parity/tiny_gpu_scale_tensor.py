"""Parity spec: tiny_gpu_scale_tensor  (out[i] = x[i] * s; one rounding, so bit-exact)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling

ref = sibling(__file__, "_reference")


def build(shape, ctx, rng):
    n = shape.dims["n"]
    x = rng.standard_normal(n).astype(np.float32)
    s = float(np.random.default_rng(n).uniform(-2.0, 2.0))  # a scalar is part of the layout: the shape's, not the seed's
    return Call(args={"out": Out("f32", (n,)), "x": In(x), "s": s, "n": n}, expect={"out": ref.scale(x, s)})


SPEC = UnitSpec(
    unit="tiny_gpu_scale_tensor",
    reference="tinytarget.parity._reference.scale",
    outputs={"out": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape("n=1", {"n": 1}),
        Shape("n=1000 (not a multiple of 256)", {"n": 1000}),
        Shape("n=2^20+3 (bandwidth)", {"n": (1 << 20) + 3}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n"],
)
