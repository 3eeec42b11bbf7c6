"""Parity spec: ds4_gpu_attention_decode_raw_batch_heads_tensor (n_tokens decode tokens at
positions pos0.., 64 heads x 512, over the raw ring only: the ring holds the n_raw
most recent positions pos0 + n_tokens - n_raw .. pos0 + n_tokens - 1 -- the batch's
own rows included -- logical row i at ring row (raw_start + i) % raw_cap; token t
sees the positions in (pos0 + t - window, pos0 + t]; per-head sinks).

ds4: ring of 128 rows, window 128.  Upstream uses a per-(token, head) kernel
below 128 tokens and an online 8-heads kernel from 128 tokens on.  Shapes:
a decode token, a speculative batch of 2 whose first token must not see the
second's row, batches whose early tokens see fewer rows than the window,
a ring wrapped mid-batch, and 128+ token batches.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "decode_raw_batch"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, pos0, n_raw, raw_start, raw_cap=128, window=128, n_head=64, head_dim=512):
    return {"n_tokens": n_tokens, "pos0": pos0, "n_raw": n_raw, "raw_cap": raw_cap, "raw_start": raw_start,
            "window": window, "n_head": n_head, "head_dim": head_dim}


SMALL = "batch: 2 tokens at 5000, full ring wrapped at 90 (token 0 must not see token 1)"
BIG = "batch: 128 tokens at 1000, full ring (online kernel)"

DISPATCH = {
    "attention_decode_mixed_kernel": f"n_tokens < 128 -> reached by shape '{SMALL}'",
    "attention_decode_mixed_heads8_online_kernel": f"n_tokens >= 128, head_dim 512 -> reached by shape '{BIG}'",
    "attention_decode_mixed_heads8_online_kernel (< 128 tokens)": f"DS4_CUDA_WINDOW_ATTENTION=1 -> reached by shape '{SMALL}' with KNOWN_GOOD_ENV[0]",
    "attention_decode_mixed_kernel (>= 128 tokens)": f"DS4_CUDA_NO_WINDOW_ATTENTION=1 -> reached by shape '{BIG}' with KNOWN_GOOD_ENV[1]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_WINDOW_ATTENTION": "1"}, {"DS4_CUDA_NO_WINDOW_ATTENTION": "1"}]

SPEC = UnitSpec(
    unit="ds4_gpu_attention_decode_raw_batch_heads_tensor",
    reference="reference.ds4_attention_ops.attention_decode_raw_batch_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape("decode: 1 token at 4096, full ring from 0", dims(1, 4096, 128, 0)),
        Shape(SMALL, dims(2, 5000, 128, 90)),
        Shape("batch: 6 tokens at 3, ring filling (9 rows from 0)", dims(6, 3, 9, 0)),
        Shape("batch: 16 tokens at 700, window 100 inside a 128-row ring wrapped at 127", dims(16, 700, 128, 127,
                                                                                               window=100)),
        Shape(BIG, dims(128, 1000, 128, 0)),
        Shape("batch: 130 tokens at 0, ring of 130 rows, window 128", dims(130, 0, 130, 0, raw_cap=130)),
        Shape("odd: 3 heads x 96, 4 tokens at 20, 6 of 7 ring rows from 5, window 3",
              dims(4, 20, 6, 5, raw_cap=7, window=3, n_head=3, head_dim=96)),
        Shape("decode: 1 token at 4096, scores +200", I.shifted(dims(1, 4096, 128, 0)), edge=I.EDGE_SHIFTED),
        Shape("batch: 2 tokens at 5000, scores +200", I.shifted(dims(2, 5000, 128, 90)), edge=I.EDGE_SHIFTED),
        Shape("batch: 128 tokens at 1000, scores +200", I.shifted(dims(128, 1000, 128, 0)), edge=I.EDGE_SHIFTED),
        Shape("decode batch: 8 tokens at 8192, full ring (timing)", dims(8, 8192, 128, 31), timed=True),
        # A later prefill chunk at ds4's working batch: 2048 tokens (ds4.c prefills in chunks of 2048), the raw
        # ring sized for a chunk plus the window (metal_graph_raw_cap_for_context: align_up(128 + 2048, 256) =
        # 2304 rows), the chunk's 2048 rows and the window of 128 before it live (n_raw 2176 and raw_start as
        # metal_graph_raw_span_for_batch and metal_graph_raw_start_for_span put them).
        Shape("prefill chunk, raw layer: 2048 tokens at 2048, 2176 of 2304 ring rows (timing)",
              dims(2048, 2048, 2176, (4096 - 2176) % 2304, raw_cap=2304), timed=True),
        Shape("error: n_raw 0", dims(1, 10, 0, 0), expect="error", why="no raw rows"),
        Shape("error: raw_start >= raw_cap", dims(1, 10, 4, 128), expect="error", why="the ring start must be a ring row"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
