"""Parity spec: ds4_gpu_shared_down_hc_expand_q8_0_tensor: the shared expert's
down projection, added to the routed experts' output and mixed into the HC
streams (one token).

    shared_out = W_down Q8_0(shared_mid)                     (ffn_down_shexp, 2048 -> 4096)
    out_hc[h]  = (shared_out + routed_out) * post[h] + sum_s comb[h + s n_hc] * residual_hc[s]

shared_out is the projection alone (the routed part is not in it); routed_out
has the projection's magnitude, so ignoring it, or adding it into
shared_out, fails.  Reference: ds4.c's matvec_q8_0 + hc_post_one; tolerance
as ds4_gpu_matmul_q8_0_hc_expand_tensor."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "matmul_q8_0_hc_expand_preq_warp8_kernel with has_add (+ quantize_q8_0_f32_kernel)":
        "no knob -> reached by shape 'ffn_down_shexp 2048->4096, n_hc 4 (decode)'",
    "non-dp4a block dot": "DS4_CUDA_NO_Q8_DP4A, or in_dim % 32 != 0 -> reached by shape 'odd 100->37, n_hc 4'",
    "ds4_gpu_matmul_q8_0_tensor + hc_expand_kernel (has_add)": "DS4_CUDA_DISABLE_Q8_HC_EXPAND_FUSED -> knob",
    "multi-token paths of ds4_gpu_matmul_q8_0_tensor (dequant_q8_0_to_f16/_f32_kernel, f32_to_f16_kernel + cuBLAS, "
    "matmul_q8_0_preq_batch_warp8_kernel, matmul_q8_0_preq_kernel)":
        "need n_tok > 1, and the unfused path passes n_tok = 1 (one matmul_q8_0_preq_warp8_kernel) -> no case: "
        "unreachable from this op",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_Q8_DP4A": "1"}, {"DS4_CUDA_DISABLE_Q8_HC_EXPAND_FUSED": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    in_dim, n_embd, n_hc = d["in_dim"], d["n_embd"], d["n_hc"]
    out_dim = d.get("out_dim", n_embd)
    m, (off,), _ = W.dense(shape, ctx, rng, [("Q8_0", out_dim, W.pad32(in_dim))])
    W.mirror_if_cancelling(d, m, [off], out_dim, W.pad32(in_dim) // 32 * 34)
    mid = W.activations(rng, d, (in_dim,))
    routed = rng.standard_normal(max(out_dim, n_embd)).astype(np.float32)
    res = rng.standard_normal((n_hc, n_embd)).astype(np.float32)
    split = rng.uniform(-1.0, 1.0, 2 * n_hc + n_hc * n_hc).astype(np.float32)
    args = {"out_hc": Out("f32", (n_hc, n_embd)), "shared_out": Out("f32", (max(out_dim, n_embd),)),
            "model_map": m, "model_size": m.size, "weight_offset": off, "in_dim": in_dim, "out_dim": out_dim,
            "shared_mid": In(mid), "routed_out": In(routed), "residual_hc": In(res), "split": In(split),
            "n_embd": n_embd, "n_hc": n_hc}
    if shape.expect == "error":
        return Call(args=args)
    out_hc, shared = mo.shared_down_hc_expand_q8_0(m.array, off, in_dim, out_dim, mid, routed, res, split,
                                                   n_embd, n_hc)
    return Call(args=args, expect={"out_hc": out_hc, "shared_out": shared})


# launched by ds4_gpu_matmul_q8_0_tensor only for n_tok > 1, and this op always passes n_tok = 1
_MULTI_TOKEN = "multi-token Q8_0 path of ds4_gpu_matmul_q8_0_tensor; this op passes n_tok = 1"
UNREACHABLE = {k: _MULTI_TOKEN for k in ("dequant_q8_0_to_f16_kernel", "dequant_q8_0_to_f32_kernel", "f32_to_f16_kernel",
                                         "matmul_q8_0_preq_batch_warp8_kernel", "matmul_q8_0_preq_kernel")}

SPEC = UnitSpec(
    unit="ds4_gpu_shared_down_hc_expand_q8_0_tensor",
    reference="reference.ds4_matmul_ops.shared_down_hc_expand_q8_0",
    inputs=W.INPUTS,
    outputs={"out_hc": Tol(nmse=1e-5, max_err_rms=3e-2), "shared_out": Tol(nmse=1e-4, max_err_rms=6e-2)},
    shapes=[
        Shape("ffn_down_shexp 2048->4096, n_hc 4 (decode)", {"in_dim": 2048, "n_embd": 4096, "n_hc": 4},
              source="model:blk.3.ffn_down_shexp.weight", timed=True),
        Shape("ffn_down_shexp 2048->4096, n_hc 4 (layer 40)", {"in_dim": 2048, "n_embd": 4096, "n_hc": 4},
              source="model:blk.40.ffn_down_shexp.weight"),
        Shape("odd 100->37, n_hc 4", {"in_dim": 100, "n_embd": 37, "n_hc": 4}),
        Shape("odd 1056->65, n_hc 3", {"in_dim": 1056, "n_embd": 65, "n_hc": 3}),
        Shape("edge: cancelling halves, 2048->4096, n_hc 4", {"in_dim": 2048, "n_embd": 4096, "n_hc": 4,
                                                                "cancel": True}, edge=W.CANCEL),
        Shape("edge: mid x1e5, 2048->4096, n_hc 4", {"in_dim": 2048, "n_embd": 4096, "n_hc": 4, "x_scale": 1e5},
              edge=W.HUGE),
        # No "out_dim != n_embd must fail" case: upstream's fused kernel refuses it, but with
        # DS4_CUDA_DISABLE_Q8_HC_EXPAND_FUSED (a known-good variant) the same call runs as the plain
        # Q8_0 matmul then the HC expand, and neither checks it (measured on the H100: returns
        # success).  A port may take either path, so the spec cannot require the refusal.
    ],
    build=build,
    bytes_moved=lambda s: s.dims["n_embd"] * (s.dims["in_dim"] + 31) // 32 * 34
    + 4 * (s.dims["in_dim"] + s.dims["n_embd"] * (2 * s.dims["n_hc"] + 2)),
)
