"""Parity spec: mini_gpu_matmul_q4_k_tensor (the abandoned variant: the fixture has no
Q4_K tensor, so every case is synthetic random valid Q4_K blocks), with the dense projections' edges
(_shared.dense_edges).  No 524280-token batch (the known-good's grid limit): at in_dim 256 its x alone is
537 MB.

Tolerance: NMSE <= 1e-6, float32 accumulation in any order and half activations.  The block-scale edge
keeps to it: d and dmin are finite halves (dmin up to 8000), only the float32 mins dmin*m and decoded
weights pass 65504."""
from porter.spec import Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")

BASE = Shape("7x256 (1 block), 1 token", {"n_tok": 1, "out_dim": 7, "in_dim": 256})
BAD, build_checked = sh.with_bad_tensors(sh.dense_matmul("Q4_K", ops.matmul_q4_k), BASE, ("out", "x"))

SPEC = UnitSpec(
    unit="mini_gpu_matmul_q4_k_tensor",
    reference="reference.minimoe_ops.matmul_q4_k",
    inputs=sh.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=5e-3)},
    shapes=[
        BASE,
        Shape("33x512, 5 tokens", {"n_tok": 5, "out_dim": 33, "in_dim": 512}),
        Shape("3x2304 (9 blocks), 9 tokens", {"n_tok": 9, "out_dim": 3, "in_dim": 2304}),
        Shape("256x1024, 8 tokens", {"n_tok": 8, "out_dim": 256, "in_dim": 1024}, timed=True),
        Shape("error: in_dim 128 not a multiple of 256", {"n_tok": 1, "out_dim": 2, "in_dim": 256,
              "call_in_dim": 128}, expect="error", why="in_dim must be a multiple of the 256-value block"),
    ] + sh.dense_edges(256, 144, {"out_dim": 7, "in_dim": 256}, grid_in_dim=None,
                      scales=(200.0, 8000.0)) + BAD,
    build=build_checked,
    bytes_moved=sh.dense_bytes("Q4_K"),
    flops=sh.dense_flops,
)
