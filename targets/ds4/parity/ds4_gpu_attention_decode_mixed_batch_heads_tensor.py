"""Parity spec: ds4_gpu_attention_decode_mixed_batch_heads_tensor (decode tokens at
positions pos0.. over the raw ring (as attention_decode_raw_batch) plus the
compressed rows: token t sees the first min(n_comp, (pos0 + t + 1) / ratio), each
optionally filtered by comp_mask[t] ({0, -inf}); per-head sinks).

ds4: ratio-128 layers (no mask) and ratio-4 layers (mask = the indexer's
top 512).  The shapes put a compression boundary inside the batch (a row
becomes visible to the later tokens only), use both ratios, a mask, the
upstream switches (128 tokens -> online kernel without mask; above 7936
compressed rows -> online kernel, refused with a mask), and odd sizes.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "decode_mixed_batch"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, pos0, n_comp, ratio, n_raw=128, raw_start=0, raw_cap=128, window=128, use_mask=0, keep=0,
         n_head=64, head_dim=512):
    return {"n_tokens": n_tokens, "pos0": pos0, "n_raw": n_raw, "raw_cap": raw_cap, "raw_start": raw_start,
            "n_comp": n_comp, "ratio": ratio, "window": window, "use_mask": use_mask, "keep": keep,
            "n_head": n_head, "head_dim": head_dim}


ONE = "decode: 1 token at 65535, ratio 128, 512 compressed rows"
BATCH = "batch: 4 tokens at 4094, ratio 4, 1024 rows (row 1023 appears at token 1)"
MASKED = "batch: 3 tokens at 8190, ratio 4, 2048 rows, mask keeps 512"
BIG = "batch: 128 tokens at 1024, ratio 4, 288 rows (online kernel)"
MANY = "batch: 2 tokens at 32767, ratio 4, 8000 rows, no mask (online kernel above 7936)"

DISPATCH = {
    "attention_decode_mixed_kernel (one token)": f"n_tokens 1 -> reached by shape '{ONE}'",
    "attention_decode_mixed_kernel (8-lane rows)": f"1 < n_tokens < 128 with visible compressed rows -> reached by shape '{BATCH}'",
    "attention_decode_mixed_kernel (masked)": f"use_comp_mask -> reached by shape '{MASKED}'",
    "attention_decode_mixed_heads8_online_kernel": f"n_tokens >= 128, no mask, head_dim 512 -> reached by shape '{BIG}'",
    "attention_decode_mixed_heads8_online_kernel (many rows)": f"n_comp > 7936, no mask -> reached by shape '{MANY}'",
    "attention_decode_mixed_heads8_online_kernel (< 128 tokens)": f"DS4_CUDA_WINDOW_ATTENTION=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[0]",
}
# Not known-good: DS4_CUDA_NO_WINDOW_ATTENTION=1 also turns off the online fallback above 7936
# compressed rows, so upstream refuses shape MANY under it (a refusal, not a wrong answer).
KNOWN_GOOD_ENV = [{"DS4_CUDA_WINDOW_ATTENTION": "1"}]

SPEC = UnitSpec(
    unit="ds4_gpu_attention_decode_mixed_batch_heads_tensor",
    reference="reference.ds4_attention_ops.attention_decode_mixed_batch_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape(ONE, dims(1, 65535, 512, 128, raw_start=17)),
        Shape(BATCH, dims(4, 4094, 1024, 4, raw_start=100)),
        Shape(MASKED, dims(3, 8190, 2048, 4, raw_start=64, use_mask=1, keep=512)),
        Shape("batch: 5 tokens at 125, ratio 128, 1 row (visible from token 2 on)", dims(5, 125, 1, 128)),
        Shape(BIG, dims(128, 1024, 288, 4, raw_start=0)),
        Shape(MANY, dims(2, 32767, 8000, 4, raw_start=3)),
        Shape("odd: 3 heads x 96, 5 tokens at 30, ratio 3, 12 rows, mask keeps 5, 6 of 7 ring rows",
              dims(5, 30, 12, 3, n_raw=6, raw_start=4, raw_cap=7, window=4, use_mask=1, keep=5, n_head=3, head_dim=96)),
        Shape("1 token at 65535, ratio 128, scores +200", I.shifted(dims(1, 65535, 512, 128, raw_start=17)), edge=I.EDGE_SHIFTED),
        Shape("batch: 4 tokens at 4094, ratio 4, 1024 rows, scores +200", I.shifted(dims(4, 4094, 1024, 4, raw_start=100)), edge=I.EDGE_SHIFTED),
        Shape("batch: 3 tokens, mask keeps 512 of 2048, scores +200", I.shifted(dims(3, 8190, 2048, 4, raw_start=64, use_mask=1, keep=512)), edge=I.EDGE_SHIFTED),
        Shape("decode batch, ratio-4 layer at 8k: 8 tokens at 8184, 2048 rows, mask keeps 512 (timing)",
              dims(8, 8184, 2048, 4, raw_start=56, use_mask=1, keep=512), timed=True),
        # A later prefill chunk at ds4's working batch: 2048 tokens (ds4.c prefills in chunks of 2048), the raw
        # ring sized for a chunk plus the window (metal_graph_raw_cap_for_context: align_up(128 + 2048, 256) =
        # 2304 rows), the chunk's 2048 rows and the window of 128 before it live (n_raw 2176 and raw_start as
        # metal_graph_raw_span_for_batch and metal_graph_raw_start_for_span put them).
        # On a ratio-128 layer at 32k that is 256 compressed rows, no mask.
        Shape("prefill chunk, ratio-128 layer at 32k: 2048 tokens at 30720, 256 rows (timing)",
              dims(2048, 30720, 256, 128, n_raw=2176, raw_start=(32768 - 2176) % 2304, raw_cap=2304),
              timed=True),
        Shape("error: compressed rows with ratio 0", dims(2, 100, 10, 0), expect="error",
              why="the compressed rows' visibility divides by ratio"),
        Shape("error: 8000 rows with a mask", dims(2, 32767, 8000, 4, use_mask=1, keep=512), expect="error",
              why="upstream holds at most 7936 compressed scores and has no masked online path"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
