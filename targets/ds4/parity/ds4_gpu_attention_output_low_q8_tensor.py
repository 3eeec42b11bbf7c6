"""Parity spec: ds4_gpu_attention_output_low_q8_tensor: the grouped low-rank
attention output A projection of one token.

    low[g*rank + r] = W_a[g*rank + r] . Q8_0(heads[g])      g < n_groups, r < rank

ds4: 64 heads x 512 in 8 groups (group_dim 4096), rank 1024 (attn_output_a,
8192 Q8_0 rows of 4096).  Each group's rows must see only their own group of
heads: the heads of different groups are independent random values, so
reading group 0 everywhere, or the wrong rows, fails.  Odd sizes: a partial
last block (group_dim 100), more blocks than lanes, one group.

Reference: ds4.c's matvec_q8_0_grouped_rows (each group's heads quantized to
Q8_0 per block of 32).  Upstream quantizes the same way (float32 accumulation
order is the only difference); bounds as ds4_gpu_matmul_q8_0_tensor's."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "grouped_q8_0_a_preq_warp8_kernel (+ quantize_q8_0_f32_kernel), dp4a dot":
        "always, no knob -> reached by shape 'attn_output_a 8 x 4096 -> 8 x 1024 (decode)'",
    "non-dp4a block dot": "DS4_CUDA_NO_Q8_DP4A, or group_dim % 32 != 0 -> reached by shape "
                          "'odd 3 groups of 100 -> 37 (partial last block)'",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_Q8_DP4A": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    group_dim, rank, n_groups = d["group_dim"], d["rank"], d["n_groups"]
    rows = max(n_groups * rank, 1)
    m, (off,), _ = W.dense(shape, ctx, rng, [("Q8_0", rows, W.pad32(group_dim))])
    if d.get("offset_past_end"):
        off = m.size - rows * W.pad32(group_dim) // 32 * 34 // 2
    heads = rng.standard_normal((n_groups, group_dim)).astype(np.float32)
    args = {"low": Out("f32", (rows,)), "model_map": m, "model_size": m.size, "out_a_offset": off,
            "group_dim": group_dim, "rank": rank, "n_groups": n_groups, "heads": In(heads)}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"low": mo.attention_output_low_q8(m.array, off, group_dim, rank, n_groups,
                                                                      heads)[0]})


SPEC = UnitSpec(
    unit="ds4_gpu_attention_output_low_q8_tensor",
    reference="reference.ds4_matmul_ops.attention_output_low_q8",
    inputs=W.INPUTS,
    outputs={"low": Tol(nmse=1e-4, max_err_rms=6e-2)},
    shapes=[
        Shape("attn_output_a 8 x 4096 -> 8 x 1024 (decode)", {"group_dim": 4096, "rank": 1024, "n_groups": 8},
              source="model:blk.3.attn_output_a.weight", timed=True),
        Shape("attn_output_a 8 x 4096 -> 8 x 1024 (layer 2)", {"group_dim": 4096, "rank": 1024, "n_groups": 8},
              source="model:blk.2.attn_output_a.weight"),
        Shape("odd 3 groups of 100 -> 37 (partial last block)", {"group_dim": 100, "rank": 37, "n_groups": 3}),
        Shape("odd 2 groups of 2080 -> 16 (65 blocks)", {"group_dim": 2080, "rank": 16, "n_groups": 2}),
        Shape("odd 1 group of 512 -> 9", {"group_dim": 512, "rank": 9, "n_groups": 1}),
        Shape("error: rank 0", {"group_dim": 64, "rank": 0, "n_groups": 2}, expect="error",
              why="upstream refuses an empty projection"),
        Shape("error: weights run past the map", {"group_dim": 256, "rank": 32, "n_groups": 2,
                                                  "offset_past_end": True},
              expect="error", why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: s.dims["n_groups"] * s.dims["rank"] * (s.dims["group_dim"] + 31) // 32 * 34
    + 4 * s.dims["n_groups"] * (s.dims["group_dim"] + s.dims["rank"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
