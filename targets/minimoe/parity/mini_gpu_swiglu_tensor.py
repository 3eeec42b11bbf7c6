"""Parity spec: mini_gpu_swiglu_tensor  (out[i] = silu(gate[i]) * up[i]).

A call with n = 0 has nothing to do: the Metal backend returns 0 for it once its tensors hold
(mini_metal.m), and so do the CPU backend and the known-good."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")

N_TOKENS_X_TOPK_X_NFF = 3 * 2 * 256  # the engine's call for 3 tokens: n_tokens * top_k * n_ff


INPUTS = "gate ~ N(0, 3^2), up ~ N(0, 1); from n = 8 on, n/64 gates (at least 2) at -100, -30, 30 or 90, -100 and 90 always"
# gates of +-90..100 are past expf's float32 range (88.7): a sigmoid written expf(g) / (1 + expf(g))
# returns NaN at g = 90; the known-good's g / (1 + expf(-g)) is exact at both ends
EDGE_TAILS = "gates at -100 / 90: past expf's range (the known-good's g / (1 + expf(-g)) is exact there)"


def build(shape, ctx, rng):
    n = shape.dims["n"]
    gate = (rng.standard_normal(n) * 3.0).astype(np.float32)
    if n >= 8:  # saturating tails: exp(-g) overflows float32 for g < -88, exp(g) for g > 88
        at = rng.choice(n, max(2, n // 64), replace=False)
        gate[at] = rng.choice([-100.0, -30.0, 30.0, 90.0], at.size)
        gate[at[:2]] = (-100.0, 90.0)  # both ends in every call
    up = rng.standard_normal(n).astype(np.float32)
    return Call(
        args={"out": Out("f32", (n,)), "gate": In(gate), "up": In(up), "n": n},
        expect={"out": ops.swiglu(gate, up, n)},
    )


BASE = Shape("n=7", {"n": 7})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "gate", "up"))

SPEC = UnitSpec(
    unit="mini_gpu_swiglu_tensor",
    reference="reference.minimoe_ops.swiglu",
    inputs=INPUTS,
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("n=1", {"n": 1}),
        BASE,
        Shape("n=1000 (not a multiple of 32/256)", {"n": 1000}, edge=EDGE_TAILS),
        Shape("n=1536 (3 tokens x top_k 2 x n_ff 256)", {"n": N_TOKENS_X_TOPK_X_NFF}, edge=EDGE_TAILS),
        Shape("n=0: nothing to do, success", {"n": 0},
              zero_answer="n = 0: an empty output, which any answer matches; the return code is the check"),
        Shape("n=2^20+3 (bandwidth)", {"n": (1 << 20) + 3}, timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 12 * s.dims["n"],
)
