"""Parity spec: mini_gpu_swiglu_tensor  (out[i] = silu(gate[i]) * up[i])."""
import numpy as np

from porter.gates.parity.spec import Call, In, Out, Shape, Tol, UnitSpec
from reference import minimoe_ops as ops

N_TOKENS_X_TOPK_X_NFF = 3 * 2 * 256  # the engine's call for 3 tokens: n_tokens * top_k * n_ff


def build(shape, ctx, rng):
    n = shape.dims["n"]
    gate = (rng.standard_normal(n) * 3.0).astype(np.float32)
    if n >= 8:  # saturating tails: exp(-g) overflows float32 for g < -88
        gate[rng.integers(0, n, max(1, n // 64))] = rng.choice([-100.0, -30.0, 30.0, 90.0])
    up = rng.standard_normal(n).astype(np.float32)
    return Call(
        args={"out": Out("f32", (n,)), "gate": In(gate), "up": In(up), "n": n},
        expect={"out": ops.swiglu(gate, up, n)},
    )


SPEC = UnitSpec(
    unit="mini_gpu_swiglu_tensor",
    reference="reference.minimoe_ops.swiglu",
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("n=1", {"n": 1}),
        Shape("n=7", {"n": 7}),
        Shape("n=1000 (not a multiple of 32/256)", {"n": 1000}),
        Shape("n=1536 (3 tokens x top_k 2 x n_ff 256)", {"n": N_TOKENS_X_TOPK_X_NFF}),
        Shape("n=2^20+3 (bandwidth)", {"n": (1 << 20) + 3}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)
