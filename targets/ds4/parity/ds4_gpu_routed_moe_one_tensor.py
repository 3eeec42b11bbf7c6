"""Parity spec: ds4_gpu_routed_moe_one_tensor: one token's routed FFN.

    out = sum_k W_down[e_k] Q8_K(silu(min(g, c)) * clip(u, -c, c) * weights[k]),
    g, u = W_gate[e_k] Q8_K(x), W_up[e_k] Q8_K(x),   e_k = selected[k]

Types: IQ2_XXS gate/up with Q2_K down (GGML 16/10, ds4's DeepSeek V4 Flash
file) and Q4_K throughout (12/12, the high-memory variant).  The real decode
case has ds4's sizes (4096 -> 2048 -> 4096, 6 of 256 experts; the tensors
named by source "model:..."); smaller cases cover the other launch paths of
upstream's decode: in_dim 4352 (17 Q8_K blocks) takes the non-LUT IQ2_XXS
gate kernel, 4 and 3 slots take the generic down kernel and the separate sum.
See _ds4_moe.py for the expert maps and the selection.

Compared outputs: `out` and `mid` (the per-slot SwiGLU output, router weight
applied).  `gate`, `up` and `experts` are scratch (ds4's CUDA backend keeps
the quantized activations there) and are only checked for staying inside
their bounds.

Tolerance: the reference quantizes x and mid to Q8_K exactly as ds4.c does, so
a right kernel differs only by float32 accumulation and by the rare mid value
that rounds to the other Q8_K code (one code step of one element: ~2e-3 of the
output RMS at these sizes)."""
from porter.gates.parity.spec import Shape, Tol, UnitSpec, sibling
from reference import ds4_ops as ops

M = sibling(__file__, "_ds4_moe")
C = ops.SWIGLU_CLAMP
L3 = "model:blk.3.ffn_gate_exps.weight,blk.3.ffn_up_exps.weight,blk.3.ffn_down_exps.weight"

DISPATCH = {
    "moe_gate_up_mid_decode_lut_qwarp32_kernel (LUT IQ2_XXS dot)": "in_dim/256 <= 16, IQ2_XXS -> reached by shape "
        "'decode: 6 of 256, 4096 -> 2048 -> 4096 (ds4)'",
    "moe_gate_up_mid_qwarp32_kernel (non-LUT IQ2_XXS dot)": "in_dim/256 > 16, or DS4_CUDA_MOE_NO_DECODE_LUT_GATE -> "
        "reached by shape '6 experts, 4352 -> 256 -> 256 (17 blocks: non-LUT gate)'",
    "moe_down_sum6_qwarp32_kernel": "n_expert == 6 -> reached by shape 'decode: 6 of 256, 4096 -> 2048 -> 4096 (ds4)'",
    "moe_down_qwarp32_kernel + moe_sum_kernel": "n_expert != 6, or DS4_CUDA_MOE_NO_DIRECT_DOWN_SUM6 -> reached by "
        "shape '4 experts (not 6), 256 -> 256 -> 768, clamp 10'",
    "moe_gate_up_mid_decode_q4K_qwarp32_kernel + moe_down_q4K_sum6_qwarp32_kernel": "Q4_K pair, n_expert == 6, "
        "in_dim <= 4096 -> reached by shape 'Q4_K decode: 6 of 256, 4096 -> 2048 -> 4096'",
    "Q4_K with n_expert != 6": "upstream returns 0 -> no case (ds4 always routes 6)",
    "Q4_K with in_dim > 4096": "upstream runs the IQ2_XXS non-LUT kernel on Q4_K blocks (wrong) -> no case",
    "sorted-pair / expert-tile kernels (moe_count/prefix/scatter_sorted_pairs, moe_build_expert_tile*, "
    "moe_*_expert_tile*, moe_*_sorted*, zero_kernel)":
        "n_tokens > 1 only, and ds4_gpu_routed_moe_one_tensor passes n_tokens = 1 to routed_moe_launch -> no case: "
        "unreachable from this op (ds4_gpu_routed_moe_batch_tensor's spec reaches them)",
    "moe_gate_up_mid_f32_kernel + moe_down_f32_kernel + moe_sum_kernel (float activations)":
        "the experts scratch smaller than the Q8_K copy of x (ds4's engine never does that) -> no case: it skips "
        "ds4.c's Q8_K rounding, ~5e-5 NMSE off the reference (see the batch spec)",
}
# Not known-good: DS4_CUDA_MOE_NO_DECODE_LUT_GATE and DS4_CUDA_MOE_NO_DIRECT_DOWN_SUM6 send the Q4_K cases to
# the IQ2_XXS gate / Q2_K down kernels (upstream ignores q4k_path there: wrong answers), and the kernels they
# select are reached by shapes above (in_dim 4352, 4 and 3 slots).
KNOWN_GOOD_ENV = [{"DS4_CUDA_MOE_WRITE_GATE_UP": "1"}]


def build(shape, ctx, rng):
    return M.build(shape, ctx, rng, batch=False)


def _d(n_expert, in_dim, mid_dim, out_dim, clamp=C, **kw):
    return {"n_expert": n_expert, "in_dim": in_dim, "mid_dim": mid_dim, "out_dim": out_dim, "clamp": clamp, **kw}


_BATCH_ONLY = "a prefill (n_tokens > 1) kernel of routed_moe_launch; this op passes n_tokens = 1"
_F32_FALLBACK = "the float-activation fallback: only when the experts scratch is smaller than the Q8_K copy of x, which ds4 never allocates; it skips ds4.c's Q8_K rounding, so the reference cannot judge it (~5e-5 NMSE off)"
UNREACHABLE = {**{k: _BATCH_ONLY for k in (
    "moe_count_sorted_pairs_kernel", "moe_prefix_sorted_pairs_kernel", "moe_scatter_sorted_pairs_kernel",
    "moe_build_expert_tile_offsets_kernel", "moe_build_expert_tiles_kernel", "zero_kernel",
    "moe_gate_up_mid_expert_tile4_row32_kernel", "moe_gate_up_mid_expert_tile8_row32_kernel",
    "moe_gate_up_mid_expert_tile8_row2048_kernel", "moe_gate_up_mid_expert_tile8_rowspan_kernel",
    "moe_gate_up_mid_sorted_p2_qwarp32_kernel", "moe_gate_up_mid_sorted_qwarp32_kernel",
    "moe_down_expert_tile4_row32_kernel", "moe_down_expert_tile8_row32_kernel", "moe_down_expert_tile16_row32_kernel",
    "moe_down_expert_tile16_row2048_kernel", "moe_down_expert_tile16_rowspan_kernel",
    "moe_down_sorted_p2_qwarp32_kernel", "moe_down_sorted_qwarp32_kernel")},
               "moe_gate_up_mid_f32_kernel": _F32_FALLBACK, "moe_down_f32_kernel": _F32_FALLBACK}

SPEC = UnitSpec(
    unit="ds4_gpu_routed_moe_one_tensor",
    reference="reference.ds4_matmul_ops.routed_moe_one",
    inputs=M.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=1e-2), "mid": Tol(nmse=1e-8, max_err_rms=1e-3)},
    shapes=[
        Shape("decode: 6 of 256, 4096 -> 2048 -> 4096 (ds4)", _d(6, 4096, 2048, 4096), source=L3, timed=True),
        Shape("Q4_K decode: 6 of 256, 4096 -> 2048 -> 4096", _d(6, 4096, 2048, 4096, gate="Q4_K"), source=L3),
        Shape("6 experts, 4352 -> 256 -> 256 (17 blocks: non-LUT gate)", _d(6, 4352, 256, 256)),
        Shape("decode: 6 of 256 experts, 512 -> 256 -> 512, clamp 10", _d(6, 512, 256, 512)),
        Shape("6 experts, 256 -> 512 -> 256, x x6 so the clamp bites", _d(6, 256, 512, 256, x_scale=6.0)),
        Shape("4 experts (not 6), 256 -> 256 -> 768, clamp 10", _d(4, 256, 256, 768)),
        Shape("3 experts, 1024 -> 256 -> 256, no clamp", _d(3, 1024, 256, 256, clamp=0.0)),
        Shape("Q4_K: 6 experts, 512 -> 256 -> 512, x x6", _d(6, 512, 256, 512, gate="Q4_K", x_scale=6.0)),
        Shape("error: gate type Q8_0 (8)", _d(6, 256, 256, 256, gate_type=8), expect="error",
              why="only the (IQ2_XXS, Q2_K) and (Q4_K, Q4_K) type pairs exist"),
        Shape("error: down experts run past the map", _d(6, 256, 256, 256, down_past_end=True), expect="error",
              why="the 256 down experts must lie inside the model map"),
    ],
    build=build,
    bytes_moved=M.moved,
)
