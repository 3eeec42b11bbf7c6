"""Parity spec: ds4_gpu_swiglu_tensor (out = silu(min(g, c)) * clip(u, -c, c) * weight;
no clamp when c <= 1e-6).  The reference follows ds4.c's CPU swiglu() (the
engine's own CPU path) plus the GPU API's weight factor; ds4 calls it with the
shared expert's 2048 values, clamp 10 (DS4_SWIGLU_CLAMP_EXP) and weight 1."""
import numpy as np

from porter.gates.parity.spec import Call, In, Out, Shape, Tol, UnitSpec
from reference import ds4_ops as ops


def build(shape, ctx, rng):
    d = shape.dims
    n = d["n"]
    gate = (rng.standard_normal(n) * 8.0).astype(np.float32)  # wide enough that the clamp bites
    up = (rng.standard_normal(n) * 8.0).astype(np.float32)
    return Call(args={"out": Out("f32", (n,)), "gate": In(gate), "up": In(up), "n": n, "clamp": d["clamp"],
                      "weight": d["weight"]},
                expect={"out": ops.swiglu(gate, up, n, d["clamp"], d["weight"])})


SPEC = UnitSpec(
    unit="ds4_gpu_swiglu_tensor",
    reference="reference.ds4_ops.swiglu",
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("shared expert: 2048, clamp 10, weight 1", {"n": ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 1.0}),
        Shape("routed slot: 2048, clamp 10, weight 0.37", {"n": ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 0.37}),
        Shape("no clamp: 7 values", {"n": 7, "clamp": 0.0, "weight": 1.0}),
        Shape("odd 1000, clamp 3, weight 2", {"n": 1000, "clamp": 3.0, "weight": 2.0}),
        Shape("bandwidth: 2^20+3", {"n": (1 << 20) + 3, "clamp": ops.SWIGLU_CLAMP, "weight": 1.0}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)
