"""Parity spec: mini_gpu_matmul_q8_0_tensor on the fixture's real Q8_0 projections
(attention q/k/v/output, the output head) at their real offsets, plus odd
synthetic shapes (3 blocks per row, 1 row, 129 blocks per row) in a random map.

Tolerance: NMSE <= 1e-6 accepts float32 accumulation in any order and half
activations (what Metal's simdgroup matmul does for prefill) and rejects
activation quantization (q8_1-style, ~1e-5) and every structural error.  The edges
(_shared.dense_edges: no tokens, no output rows, in_dim 0, byte counts past 2^64, an odd weight offset,
activations past what half holds in float32 intermediates, a batch of 524280 tokens at
the known-good's grid limit) keep that contract: every activation is a finite half."""
from porter.spec import Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")

BASE = Shape("odd 7x96 (3 blocks), 5 tokens", {"n_tok": 5, "out_dim": 7, "in_dim": 96})
BAD, build_checked = sh.with_bad_tensors(sh.dense_matmul("Q8_0", ops.matmul_q8_0), BASE, ("out", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_matmul_q8_0_tensor",
    reference="reference.minimoe_ops.matmul_q8_0",
    inputs=sh.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=5e-3)},
    shapes=[
        Shape("attn_q 256x256, 1 token", {"n_tok": 1}, source="fixture:blk.0.attn_q.weight"),
        Shape("attn_k 64x256, 3 tokens", {"n_tok": 3}, source="fixture:blk.0.attn_k.weight"),
        Shape("attn_v 64x256, 7 tokens", {"n_tok": 7}, source="fixture:blk.1.attn_v.weight"),
        Shape("attn_output 256x256, 7 tokens", {"n_tok": 7}, source="fixture:blk.1.attn_output.weight"),
        Shape("output 512x256, 1 token (logits)", {"n_tok": 1, "real_shape": (512, 256)},
              source="fixture:output.weight", timed=True),
        Shape("attn_q 256x256, 64 tokens (prefill)", {"n_tok": 64, "real_shape": (256, 256)},
              source="fixture:blk.1.attn_q.weight", timed=True),
        BASE,
        Shape("1x32 (1 block), 3 tokens", {"n_tok": 3, "out_dim": 1, "in_dim": 32}),
        Shape("33x4128 (129 blocks), 2 tokens", {"n_tok": 2, "out_dim": 33, "in_dim": 4128}),
        Shape("error: in_dim 80 not a multiple of 32", {"n_tok": 2, "out_dim": 4, "in_dim": 96, "call_in_dim": 80},
              expect="error", why="in_dim must be a multiple of 32"),
        Shape("error: weights past the end of the map", {"n_tok": 1, "out_dim": 8, "in_dim": 64,
              "offset_past_end": True}, expect="error", why="the weight range lies outside the model map"),
    ] + sh.dense_edges(32, 34, {"out_dim": 7, "in_dim": 96}, grid_in_dim=32,
                      scales=None) + BAD,
    build=build_checked,
    bytes_moved=sh.dense_bytes("Q8_0"),
    flops=sh.dense_flops,
)
