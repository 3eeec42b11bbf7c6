"""Parity spec: mini_gpu_matmul_f16_tensor on the fixture's F16 router (8x256) and the
F16 token table used as a 512x256 matrix (timing), plus odd synthetic shapes
(in_dim 40 and 41: no multiple of 8 or even 2; n_tok 9: more than one tile of 8), and the dense
projections' edges (_shared.dense_edges): no tokens, no output rows, in_dim 0 (left open), sizes whose byte
counts pass 2^64 (errors), weights at an odd byte offset (left open: the byte-assembled path), activations
past what half can sum, and a batch of 524280 tokens (the known-good's last 8-token tile of a 65535-block
grid).

Tolerance: NMSE <= 1e-6 accepts float32 accumulation in any order and half activations (what Metal's
simdgroup matmul does for prefill).  The magnitude edge keeps that contract: every activation is a finite
half, only the float32 products, partial sums and outputs pass 65504."""
from porter.spec import Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")

BASE = Shape("odd 5x40, 3 tokens", {"n_tok": 3, "out_dim": 5, "in_dim": 40})
BAD, build_checked = sh.with_bad_tensors(sh.dense_matmul("F16", ops.matmul_f16), BASE, ("out", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_matmul_f16_tensor",
    reference="reference.minimoe_ops.matmul_f16",
    inputs=sh.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=5e-3)},
    shapes=[
        Shape("router 8x256, 1 token", {"n_tok": 1}, source="fixture:blk.0.ffn_gate_inp.weight"),
        Shape("router 8x256, 3 tokens", {"n_tok": 3}, source="fixture:blk.1.ffn_gate_inp.weight"),
        Shape("router 8x256, 7 tokens", {"n_tok": 7}, source="fixture:blk.0.ffn_gate_inp.weight"),
        Shape("token_embd as 512x256, 16 tokens", {"n_tok": 16, "real_shape": (512, 256)},
              source="fixture:token_embd.weight", timed=True),
        BASE,
        Shape("odd 3x41, 9 tokens", {"n_tok": 9, "out_dim": 3, "in_dim": 41}),
        Shape("odd 17x1000, 2 tokens", {"n_tok": 2, "out_dim": 17, "in_dim": 1000}),
        Shape("error: weights past the end of the map", {"n_tok": 1, "out_dim": 8, "in_dim": 64,
              "offset_past_end": True}, expect="error", why="the weight range lies outside the model map"),
    ] + sh.dense_edges(1, 2, {"out_dim": 5, "in_dim": 40}, grid_in_dim=8, scales=None) + BAD,
    build=build_checked,
    bytes_moved=sh.dense_bytes("F16"),
    flops=sh.dense_flops,
)
