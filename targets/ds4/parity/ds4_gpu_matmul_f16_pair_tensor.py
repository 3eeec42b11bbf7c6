"""Parity spec: ds4_gpu_matmul_f16_pair_tensor: two F16 projections of one x
(out_a = W_a x, out_b = W_b x, same sizes), ds4's compressor kv + gate pair
(4096 -> 1024 on ratio-4 layers, 4096 -> 512 on ratio-128 layers).

ds4.c calls it for one token; the API takes n_tok, and upstream answers
n_tok > 1 with two plain F16 matmuls (cuBLAS), so prefill sizes are cases
too.  The two weight tensors sit 8 KiB apart in the map and carry different
values, so a kernel that reads W_a for both outputs (or one offset twice)
fails.  Reference and tolerance as ds4_gpu_matmul_f16_tensor (x stays float32
in ds4.c; upstream's cuBLAS path rounds x to F16)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "matmul_f16_pair_ordered_chunks_kernel": "n_tok == 1, no knob -> reached by shape 'compressor kv+gate (ratio 4) 4096->1024, decode'",
    "2 x ds4_gpu_matmul_f16_tensor -> cublasGemmEx": "n_tok > 1 -> reached by shape 'compressor kv+gate (ratio 4) 4096->1024, 129 tokens'",
    "2 x ds4_gpu_matmul_f16_tensor -> matmul_f16_ordered_chunks_kernel":
        "n_tok == 1 with DS4_CUDA_NO_F16_PAIR_MATMUL (or DS4_CUDA_SERIAL_ROUTER: no pair shape is the router's) "
        "-> knob",
    "2 x ds4_gpu_matmul_f16_tensor -> matmul_f16_kernel": "n_tok == 1 with DS4_CUDA_NO_ORDERED_F16_MATMUL -> knob",
    "2 x ds4_gpu_matmul_f16_tensor -> matmul_f16_serial_kernel": "DS4_CUDA_SERIAL_F16_MATMUL (any n_tok) -> knob",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_F16_PAIR_MATMUL": "1"}, {"DS4_CUDA_NO_ORDERED_F16_MATMUL": "1"},
                  {"DS4_CUDA_SERIAL_F16_MATMUL": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, in_dim, out_dim = d["n_tok"], d["in_dim"], d["out_dim"]
    cols = max(in_dim, 1)
    m, (off_a, off_b), _ = W.dense(shape, ctx, rng, [("F16", out_dim, cols), ("F16", out_dim, cols)])
    if d.get("b_past_end"):
        off_b = m.size - out_dim * in_dim  # half of W_b lies beyond the map
    W.mirror_if_cancelling(d, m, [off_a, off_b], out_dim, 2 * cols)
    x = W.activations(rng, d, (n_tok, cols))
    args = {"out_a": Out("f32", (n_tok, out_dim)), "out_b": Out("f32", (n_tok, out_dim)), "model_map": m,
            "model_size": m.size, "weight_a_offset": off_a, "weight_b_offset": off_b, "in_dim": in_dim,
            "out_dim": out_dim, "x": In(x), "n_tok": n_tok}
    if shape.expect == "error":
        return Call(args=args)
    a, b = mo.matmul_f16_pair(m.array, off_a, off_b, in_dim, out_dim, x, n_tok)
    return Call(args=args, expect={"out_a": a, "out_b": b})


def _s(label, n_tok, in_dim, out_dim, layer=None, **kw):
    src = f"model:blk.{layer}.attn_compressor_kv.weight,blk.{layer}.attn_compressor_gate.weight" if layer else "synthetic"
    return Shape(label, {"n_tok": n_tok, "in_dim": in_dim, "out_dim": out_dim, **kw.pop("dims", {})}, source=src, **kw)


TOL = Tol(nmse=1e-6, max_err_rms=1e-2)

SPEC = UnitSpec(
    unit="ds4_gpu_matmul_f16_pair_tensor",
    reference="reference.ds4_matmul_ops.matmul_f16_pair",
    inputs=W.INPUTS,
    outputs={"out_a": TOL, "out_b": TOL},
    shapes=[
        _s("compressor kv+gate (ratio 4) 4096->1024, decode", 1, 4096, 1024, 2, timed=True),
        _s("compressor kv+gate (ratio 128) 4096->512, decode", 1, 4096, 512, 3),
        _s("compressor kv+gate (ratio 4) 4096->1024, 2 tokens", 2, 4096, 1024, 2),
        _s("compressor kv+gate (ratio 4) 4096->1024, 129 tokens", 129, 4096, 1024, 2),
        _s("odd 100->37, decode", 1, 100, 37),
        _s("odd 4097->3, decode (short last chunk)", 1, 4097, 3),
        _s("odd 31->5, 3 tokens", 3, 31, 5),
        _s("edge: cancelling halves, kv+gate 4096->1024, decode", 1, 4096, 1024, dims={"cancel": True},
           edge=W.CANCEL),
        _s("edge: cancelling halves, kv+gate 4096->512, 3 tokens (cuBLAS)", 3, 4096, 512, dims={"cancel": True},
           edge=W.CANCEL),
        # decode only: upstream's n_tok > 1 path converts x to F16 (65504 at most)
        _s("edge: x x1e5, kv+gate 4096->1024, decode", 1, 4096, 1024, dims={"x_scale": 1e5}, edge=W.HUGE),
        _s("error: in_dim 0", 1, 0, 8, expect="error", why="upstream refuses an empty projection"),
        _s("error: W_b runs past the map", 1, 256, 64, dims={"b_past_end": True}, expect="error",
           why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: 2 * 2 * s.dims["out_dim"] * s.dims["in_dim"]
    + 4 * s.dims["n_tok"] * (s.dims["in_dim"] + 2 * s.dims["out_dim"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
