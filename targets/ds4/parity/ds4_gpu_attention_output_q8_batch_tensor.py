"""Parity spec: ds4_gpu_attention_output_q8_batch_tensor: the grouped attention
output projection of n_tokens tokens (A then B).

    low[t][g*rank + r] = W_a[g*rank + r] . Q8_0(heads[t][g])    (attn_output_a)
    out[t]             = W_b Q8_0(low[t])                       (attn_output_b, n_groups*rank -> out_dim)

ds4: 8 groups of 4096 (64 heads x 512), rank 1024, out 4096.  Token counts
cross upstream's choice between the quantized kernels (1 token) and cuBLAS on
F16-expanded weights (>= 2 tokens; DS4_CUDA_ATTENTION_OUTPUT_A_CUBLAS_MIN
moves that bound), and prefill's 127/128/129.  `low` is compared too: it is
an output ds4's graph reads; group_tmp/low_tmp are scratch (bounds only).

Reference: ds4.c's layer_grouped_out_batch (Q8_0 activations at both
stages).  Tolerance: upstream's cuBLAS path keeps heads and low in F16
instead, so low differs by the Q8_0 activation noise (NMSE ~ 3e-5) and out by
that of both stages (~ 6e-5, measured in tests/test_ds4_matmul_reference.py)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "grouped_q8_0_a_preq_warp8_kernel + matmul_q8_0_preq_warp8_kernel (B)":
        "n_tokens == 1 -> reached by shape 'attn out 8 x 4096 -> 1024 -> 4096, 1 token (decode)'",
    "attention_pack_group_heads_f16_kernel + cublasGemmStridedBatchedEx + attention_unpack_group_low_kernel (A), "
    "cublasGemmEx on F16-expanded attn_output_b (B)":
        "n_tokens >= 2 (DS4_CUDA_ATTENTION_OUTPUT_A_CUBLAS_MIN), cuBLAS ready, not quality mode -> reached by shape "
        "'attn out 8 x 4096 -> 1024 -> 4096, 2 tokens'",
    "grouped_q8_0_a_preq_warp8_kernel for n_tokens > 1 (A)":
        "n_tokens >= 2 with DS4_CUDA_NO_CUBLAS_ATTENTION_OUTPUT_A, DS4_CUDA_NO_ATTENTION_OUTPUT_F16_CACHE or "
        "DS4_CUDA_NO_Q8_F16_CACHE (the label attn_output_a allows the F16 cache at any size) -> knob",
    "matmul_q8_0_preq_batch_warp8_kernel / matmul_q8_0_preq_kernel (B, n_tokens > 1)":
        "DS4_CUDA_NO_ATTENTION_OUTPUT_F16_CACHE or DS4_CUDA_NO_Q8_F16_CACHE; batch warp when n_groups*rank <= 1024 "
        "(shape 'odd 3 groups of 100 -> 37 -> 53, 3 tokens'), preq kernel above (ds4's sizes) -> knob",
    "dequant_q8_0_to_f32_kernel + cublasSgemm on the F32-expanded attn_output_b (B)":
        "n_tokens >= 2 with DS4_CUDA_Q8_F32_ALL (tried before the F16 cache, so it masks the F16 and native B "
        "paths; A is unchanged) -> knob",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_CUBLAS_ATTENTION_OUTPUT_A": "1"}, {"DS4_CUDA_NO_ATTENTION_OUTPUT_F16_CACHE": "1"},
                  {"DS4_CUDA_NO_Q8_F16_CACHE": "1"}, {"DS4_CUDA_ATTENTION_OUTPUT_A_CUBLAS_MIN": "130"},
                  {"DS4_CUDA_NO_Q8_DP4A": "1"}, {"DS4_CUDA_Q8_F32_ALL": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    group_dim, rank, n_groups, out_dim, n_tok = d["group_dim"], d["rank"], d["n_groups"], d["out_dim"], d["n_tokens"]
    low_dim = n_groups * rank
    m, (a_off, b_off), _ = W.dense(shape, ctx, rng, [("Q8_0", max(low_dim, 1), W.pad32(group_dim)),
                                                     ("Q8_0", out_dim, W.pad32(max(low_dim, 1)))])
    if d.get("b_past_end"):
        b_off = m.size - out_dim * W.pad32(low_dim) // 32 * 34 // 2
    heads = rng.standard_normal((n_tok, n_groups, group_dim)).astype(np.float32)
    args = {"out": Out("f32", (n_tok, out_dim)), "low": Out("f32", (n_tok, max(low_dim, 1))),
            "group_tmp": Out("f32", (n_tok * n_groups * group_dim,)), "low_tmp": Out("f32", (n_tok * max(low_dim, 1),)),
            "model_map": m, "model_size": m.size, "out_a_offset": a_off, "out_b_offset": b_off,
            "group_dim": group_dim, "rank": rank, "n_groups": n_groups, "out_dim": out_dim, "heads": In(heads),
            "n_tokens": n_tok}
    if shape.expect == "error":
        return Call(args=args)
    out, low = mo.attention_output_q8_batch(m.array, a_off, b_off, group_dim, rank, n_groups, out_dim, heads, n_tok)
    return Call(args=args, expect={"out": out, "low": low})


def _real(label, n_tok, layer=3, **kw):
    return Shape(label, {"group_dim": 4096, "rank": 1024, "n_groups": 8, "out_dim": 4096, "n_tokens": n_tok},
                 source=f"model:blk.{layer}.attn_output_a.weight,blk.{layer}.attn_output_b.weight", **kw)


SPEC = UnitSpec(
    unit="ds4_gpu_attention_output_q8_batch_tensor",
    reference="reference.ds4_matmul_ops.attention_output_q8_batch",
    inputs=W.INPUTS,
    outputs={"out": Tol(nmse=2.5e-4, max_err_rms=1e-1), "low": Tol(nmse=1e-4, max_err_rms=6e-2)},
    shapes=[
        _real("attn out 8 x 4096 -> 1024 -> 4096, 1 token (decode)", 1, timed=True),
        _real("attn out 8 x 4096 -> 1024 -> 4096, 2 tokens", 2),
        _real("attn out 8 x 4096 -> 1024 -> 4096, 127 tokens", 127, layer=2),
        _real("attn out 8 x 4096 -> 1024 -> 4096, 128 tokens", 128),
        # untimed since the 2048-token chunk below times the same weights on the same path
        _real("attn out 8 x 4096 -> 1024 -> 4096, 129 tokens (prefill)", 129),
        # prefill at ds4's working batch: ds4.c prefills in chunks of 2048 tokens
        _real("attn out 8 x 4096 -> 1024 -> 4096, 2048 tokens (prefill chunk)", 2048, timed=True),
        Shape("odd 3 groups of 100 -> 37 -> 53, 3 tokens", {"group_dim": 100, "rank": 37, "n_groups": 3,
                                                            "out_dim": 53, "n_tokens": 3}),
        Shape("odd 2 groups of 2080 -> 16 -> 40, 1 token", {"group_dim": 2080, "rank": 16, "n_groups": 2,
                                                            "out_dim": 40, "n_tokens": 1}),
        Shape("error: rank 0", {"group_dim": 64, "rank": 0, "n_groups": 2, "out_dim": 8, "n_tokens": 1},
              expect="error", why="upstream refuses an empty projection"),
        Shape("error: attn_output_b runs past the map", {"group_dim": 64, "rank": 32, "n_groups": 2, "out_dim": 64,
                                                         "n_tokens": 2, "b_past_end": True},
              expect="error", why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: (s.dims["n_groups"] * s.dims["rank"] * (s.dims["group_dim"] + 31) // 32 * 34
                           + s.dims["out_dim"] * (s.dims["n_groups"] * s.dims["rank"] + 31) // 32 * 34
                           + 4 * s.dims["n_tokens"] * (s.dims["n_groups"] * (s.dims["group_dim"] + s.dims["rank"])
                                                       + s.dims["out_dim"])),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
