"""Parity spec: tiny_gpu_add_tensor  (out[i] = a[i] + b[i]; out may alias a; bit-exact)."""
import numpy as np

from porter.spec import Call, In, InOut, Out, Same, Shape, Tol, UnitSpec, sibling

ref = sibling(__file__, "_reference")


def build(shape, ctx, rng):
    n = shape.dims["n"]
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    if shape.dims.get("alias"):
        return Call(args={"out": Same("a"), "a": InOut(a), "b": In(b), "n": n}, expect={"out": ref.add(a, b)})
    return Call(args={"out": Out("f32", (n,)), "a": In(a), "b": In(b), "n": n}, expect={"out": ref.add(a, b)})


SPEC = UnitSpec(
    unit="tiny_gpu_add_tensor",
    reference="tinytarget.parity._reference.add",
    outputs={"out": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape("n=7", {"n": 7}),
        Shape("n=768 out aliases a (in place, as the engine calls it)", {"n": 768, "alias": True}),
        Shape("n=2^20+5 (bandwidth)", {"n": (1 << 20) + 5}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)
