"""Parity spec: ds4_gpu_matmul_q8_0_tensor (out[t][o] = sum_i W[o][i] x[t][i], W Q8_0).

Weights are random valid Q8_0 rows (ceil(in_dim/32) blocks of 34 bytes) at a
32-aligned offset inside a map of random bytes, so reading the wrong offset or
row stride shows.  Sizes are ds4's real projections (attn_kv 4096->512, shared
expert 4096->2048 and 2048->4096, attn_q_a 4096->1024) plus odd ones, with a
partial last block (in_dim 100) and more than 32 blocks per row (in_dim 2080).

Reference: ds4.c's matvec, which quantizes each row of x to Q8_0 (blocks of
32, d = amax/127) before the integer dot products.  Tolerance: a kernel may
instead keep x in F16/F32 (ds4's own CUDA backend does for some prefill sizes);
that differs from the Q8_0-activation answer by the activation quantization
noise, NMSE ~ (amax/127)^2/12 / E[x^2] ~ 3e-5 for Gaussian rows (measured
2.7e-5 .. 2.9e-5 on these shapes, worst element 0.024 of the RMS; see
tests/test_ds4_reference.py).  The bounds leave 3x margin over that and stay
four orders of magnitude below what a wrong block decode produces."""
import numpy as np

from porter.gates.parity.spec import Call, Context, In, Out, Shape, Tol, UnitSpec
from reference import ds4_ops as ops
from reference import quant

TOL = Tol(nmse=1e-4, max_err_rms=6e-2)


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, in_dim, out_dim = d["n_tok"], d["in_dim"], d["out_dim"]
    blocks = (in_dim + 31) // 32
    raw = quant.random_blocks("Q8_0", out_dim, blocks * 32, rng)  # rows of blocks*34 bytes, as ds4 stores them
    m, (off,) = Context.synthetic_map([raw], rng)
    if d.get("offset_past_end"):
        off = m.size - raw.size // 2  # half the weights lie beyond the map: the call must fail
    x = rng.standard_normal((n_tok, in_dim)).astype(np.float32)
    args = {"out": Out("f32", (n_tok, out_dim)), "model_map": m, "model_size": m.size, "weight_offset": off,
            "in_dim": in_dim, "out_dim": out_dim, "x": In(x), "n_tok": n_tok}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ops.matmul_q8_0(m.array, off, in_dim, out_dim, x, n_tok)})


SPEC = UnitSpec(
    unit="ds4_gpu_matmul_q8_0_tensor",
    reference="reference.ds4_ops.matmul_q8_0",
    outputs={"out": TOL},
    shapes=[
        Shape("attn_kv 4096->512, 1 token (decode)", {"n_tok": 1, "in_dim": 4096, "out_dim": 512}),
        Shape("shexp gate 4096->2048, 3 tokens", {"n_tok": 3, "in_dim": 4096, "out_dim": 2048}),
        Shape("shexp down 2048->4096, 7 tokens", {"n_tok": 7, "in_dim": 2048, "out_dim": 4096}),
        Shape("attn_q_a 4096->1024, 5 tokens", {"n_tok": 5, "in_dim": 4096, "out_dim": 1024}),
        Shape("odd 100->37 (partial last block), 3 tokens", {"n_tok": 3, "in_dim": 100, "out_dim": 37}),
        Shape("odd 2080->129 (65 blocks), 2 tokens", {"n_tok": 2, "in_dim": 2080, "out_dim": 129}),
        Shape("shexp gate 4096->2048, 1 token (timing)", {"n_tok": 1, "in_dim": 4096, "out_dim": 2048}, timed=True),
        Shape("error: weights run past the map", {"n_tok": 1, "in_dim": 256, "out_dim": 64, "offset_past_end": True},
              expect="error", why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: s.dims["out_dim"] * ops.q8_0_row_bytes(s.dims["in_dim"])
    + 4 * s.dims["n_tok"] * (s.dims["in_dim"] + s.dims["out_dim"]),
)
