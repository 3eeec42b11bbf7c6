"""Parity spec: ds4_gpu_swiglu_tensor (out = silu(min(g, c)) * clip(u, -c, c) * weight;
no clamp when c <= 1e-6).  The reference follows ds4.c's CPU swiglu() (the
engine's own CPU path) plus the GPU API's weight factor; ds4 calls it with the
shared expert's 2048 values, clamp 10 (DS4_SWIGLU_CLAMP_EXP) and weight 1."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_ops as ops


INPUTS = ("gate, up ~ N(0, 8^2): wide enough that ds4's clamp 10 bites on about a fifth of them; "
          "edge: every 16th gate and up at +-90..300, past expf's float32 range and far past the clamp")

# Every 16th gate and up far out (|v| in 90..300): expf(v) overflows float32 past 88.7.  Upstream's
# swiglu_kernel clamps first (g = min(g, clamp), u = clip(u)) and takes g / (1 + expf(-g)), which is
# exact at both ends (-0 for g = -200, g for g = +200); a sigmoid written expf(g) / (1 + expf(g))
# gives inf / inf = NaN at g = +200 where no clamp holds it.
EDGE_TAILS = "every 16th gate and up at +-90..300: past expf's range, far past the clamp"


def _tails(rng, v):
    far = np.arange(v.size) % 16 == 5
    v[far] = (rng.uniform(90.0, 300.0, int(far.sum())) * rng.choice([-1.0, 1.0], int(far.sum()))).astype(np.float32)
    return v


def build(shape, ctx, rng):
    d = shape.dims
    n = d["n"]
    gate = (rng.standard_normal(n) * 8.0).astype(np.float32)  # wide enough that the clamp bites
    up = (rng.standard_normal(n) * 8.0).astype(np.float32)
    if d.get("tails"):
        gate, up = _tails(rng, gate), _tails(rng, up)
    return Call(args={"out": Out("f32", (n,)), "gate": In(gate), "up": In(up), "n": n, "clamp": d["clamp"],
                      "weight": d["weight"]},
                expect={"out": ops.swiglu(gate, up, n, d["clamp"], d["weight"])})


SPEC = UnitSpec(
    unit="ds4_gpu_swiglu_tensor",
    reference="reference.ds4_ops.swiglu",
    inputs=INPUTS,
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("shared expert: 2048, clamp 10, weight 1", {"n": ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 1.0}),
        Shape("routed slot: 2048, clamp 10, weight 0.37", {"n": ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 0.37}),
        Shape("no clamp: 7 values", {"n": 7, "clamp": 0.0, "weight": 1.0}),
        Shape("odd 1000, clamp 3, weight 2", {"n": 1000, "clamp": 3.0, "weight": 2.0}),
        Shape("no clamp: 4096, gate and up to +-300", {"n": 4096, "clamp": 0.0, "weight": 1.0, "tails": True},
              edge=EDGE_TAILS),
        Shape("shared expert: 2048, clamp 10, gate and up to +-300",
              {"n": ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 0.37, "tails": True}, edge=EDGE_TAILS),
        # untimed since the prefill chunk below times the same kernel at the size ds4 calls
        Shape("bandwidth: 2^20+3", {"n": (1 << 20) + 3, "clamp": ops.SWIGLU_CLAMP, "weight": 1.0}),
        # ds4.c's prefill chunk: the shared expert's 2048-wide mid for 2048 tokens in one call
        Shape("prefill chunk: shared expert, 2048 tokens x 2048",
              {"n": 2048 * ops.N_FF_EXP, "clamp": ops.SWIGLU_CLAMP, "weight": 1.0}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
