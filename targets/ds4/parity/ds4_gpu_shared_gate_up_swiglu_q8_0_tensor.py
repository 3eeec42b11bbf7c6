"""Parity spec: ds4_gpu_shared_gate_up_swiglu_q8_0_tensor: the shared expert's
gate and up projections of one token and their SwiGLU.

    gate = W_gate Q8_0(x),  up = W_up Q8_0(x)       (ffn_gate_shexp / ffn_up_shexp, 4096 -> 2048)
    mid  = silu(min(gate, c)) * clip(up, -c, c)      (c = clamp; clamp <= 1e-6: no clamping)

gate and up are the raw projections (the clamp acts inside the SwiGLU only).
Cases: ds4's sizes with its clamp (10), x scaled so the clamp bites, no clamp,
odd sizes with a partial last block and more blocks than a warp has lanes.

Reference: ds4.c's matvec_q8_0 (x quantized to Q8_0) and swiglu().  Upstream
quantizes x the same way; the bounds match ds4_gpu_matmul_q8_0_tensor's."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo
from reference import ds4_ops as ops

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "matmul_q8_0_pair_preq_warp8_kernel + swiglu_kernel": "no knob -> reached by shape 'shexp 4096->2048, clamp 10'",
    "non-dp4a block dot": "DS4_CUDA_NO_Q8_DP4A, or in_dim % 32 != 0 -> reached by shape 'odd 100->37 (partial last block), clamp 10'",
    "2 x matmul_q8_0_preq_warp8_kernel + swiglu_kernel": "DS4_CUDA_DISABLE_SHARED_GATE_UP_PAIR -> knob",
    "multi-token paths of ds4_gpu_matmul_q8_0_tensor (dequant_q8_0_to_f16/_f32_kernel, f32_to_f16_kernel + cuBLAS, "
    "matmul_q8_0_preq_batch_warp8_kernel, matmul_q8_0_preq_kernel)":
        "need n_tok > 1, and both paths of this op pass n_tok = 1 -> no case: unreachable from this op",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_Q8_DP4A": "1"}, {"DS4_CUDA_DISABLE_SHARED_GATE_UP_PAIR": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    in_dim, out_dim = d["in_dim"], d["out_dim"]
    cols = W.pad32(max(in_dim, 1))
    m, (g_off, u_off), _ = W.dense(shape, ctx, rng, [("Q8_0", out_dim, cols), ("Q8_0", out_dim, cols)])
    if d.get("up_past_end"):
        u_off = m.size - out_dim * cols // 32 * 34 // 2
    W.mirror_if_cancelling(d, m, [g_off, u_off], out_dim, cols // 32 * 34)
    x = W.activations(rng, d, (max(in_dim, 1),))
    args = {"gate": Out("f32", (out_dim,)), "up": Out("f32", (out_dim,)), "mid": Out("f32", (out_dim,)),
            "model_map": m, "model_size": m.size, "gate_offset": g_off, "up_offset": u_off, "in_dim": in_dim,
            "out_dim": out_dim, "x": In(x), "clamp": d["clamp"]}
    if shape.expect == "error":
        return Call(args=args)
    g, u, mid = mo.shared_gate_up_swiglu_q8_0(m.array, g_off, u_off, in_dim, out_dim, x, d["clamp"])
    return Call(args=args, expect={"gate": g, "up": u, "mid": mid})


C = ops.SWIGLU_CLAMP
SHEXP = "model:blk.3.ffn_gate_shexp.weight,blk.3.ffn_up_shexp.weight"
TOL = Tol(nmse=1e-4, max_err_rms=6e-2)

# launched by ds4_gpu_matmul_q8_0_tensor only for n_tok > 1, and this op always passes n_tok = 1
_MULTI_TOKEN = "multi-token Q8_0 path of ds4_gpu_matmul_q8_0_tensor; this op passes n_tok = 1"
UNREACHABLE = {k: _MULTI_TOKEN for k in ("dequant_q8_0_to_f16_kernel", "dequant_q8_0_to_f32_kernel", "f32_to_f16_kernel",
                                         "matmul_q8_0_preq_batch_warp8_kernel", "matmul_q8_0_preq_kernel")}

SPEC = UnitSpec(
    unit="ds4_gpu_shared_gate_up_swiglu_q8_0_tensor",
    reference="reference.ds4_matmul_ops.shared_gate_up_swiglu_q8_0",
    inputs=W.INPUTS,
    outputs={"gate": TOL, "up": TOL, "mid": TOL},
    shapes=[
        Shape("shexp 4096->2048, clamp 10", {"in_dim": 4096, "out_dim": 2048, "clamp": C}, source=SHEXP, timed=True),
        Shape("shexp 4096->2048, x x12 so the clamp bites", {"in_dim": 4096, "out_dim": 2048, "clamp": C,
                                                               "x_scale": 12.0}, source=SHEXP),
        Shape("shexp 4096->2048, no clamp (MTP layer)", {"in_dim": 4096, "out_dim": 2048, "clamp": 0.0},
              source="model:mtp.0.ffn_gate_shexp.weight,mtp.0.ffn_up_shexp.weight"),
        Shape("odd 100->37 (partial last block), clamp 10", {"in_dim": 100, "out_dim": 37, "clamp": C, "x_scale": 8.0}),
        Shape("odd 2080->129 (65 blocks), clamp 10", {"in_dim": 2080, "out_dim": 129, "clamp": C}),
        Shape("edge: cancelling halves, 4096->2048, clamp 10", {"in_dim": 4096, "out_dim": 2048, "clamp": C,
                                                                  "cancel": True}, edge=W.CANCEL),
        Shape("edge: x x1e5, 4096->2048, clamp 10", {"in_dim": 4096, "out_dim": 2048, "clamp": C, "x_scale": 1e5},
              edge=W.HUGE),
        Shape("error: in_dim 0", {"in_dim": 0, "out_dim": 16, "clamp": C}, expect="error",
              why="upstream refuses an empty projection"),
        Shape("error: up weights run past the map", {"in_dim": 256, "out_dim": 64, "clamp": C, "up_past_end": True},
              expect="error", why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: 2 * s.dims["out_dim"] * (s.dims["in_dim"] + 31) // 32 * 34
    + 4 * (s.dims["in_dim"] + 3 * s.dims["out_dim"]),
)
