"""Parity spec: ds4_gpu_attention_prefill_static_mixed_heads_tensor (a fresh prompt's
attention on a compressed layer: token t, 64 heads x 512, over raw rows
(t - window, t] of the n_tokens rows in raw_kv plus the first
min(n_comp, (t + 1) / ratio) compressed rows; one shared KV head; sinks).

ds4: window 128, ratio-128 layers (prefill uses this static form) and ratio 4.
Upstream: >= 128 tokens -> online 8-head kernel; 2..127 tokens -> cuBLAS
(TF32) over raw + compressed keys with a masking softmax; 1 token or other
widths -> a plain kernel.  Shapes straddle 128 tokens and the window, put
compression boundaries inside the prompt (row k appears at token
(k + 1) * ratio - 1), and use both ratios and odd sizes.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "prefill_static"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, ratio, n_comp=None, window=128, n_head=64, head_dim=512):
    return {"n_tokens": n_tokens, "ratio": ratio, "n_comp": n_tokens // ratio if n_comp is None else n_comp,
            "window": window, "n_head": n_head, "head_dim": head_dim}


ONE = "1 token, ratio 4 (no compressed row yet)"
CUBLAS = "100 tokens, ratio 4, 25 rows (cuBLAS path)"
ONLINE = "200 tokens, ratio 4, 50 rows (online path)"
ODD = "odd: 3 heads x 96, 20 tokens, window 6, ratio 3, 6 rows"

DISPATCH = {
    "attention_prefill_mixed_kernel": f"n_tokens 1 -> reached by shape '{ONE}'",
    "attention_prefill_mixed_kernel (odd width)": f"head_dim != 512 -> reached by shape '{ODD}'",
    "attention_prefill_pack_mixed_kv_kernel + cuBLAS + attention_prefill_mixed_softmax_kernel": f"2 <= n_tokens < 128 -> reached by shape '{CUBLAS}'",
    "attention_static_mixed_heads8_online_kernel": f"n_tokens >= 128, head_dim 512 -> reached by shape '{ONLINE}'",
    "attention_static_mixed_heads8_online_kernel (< 128 tokens)": f"DS4_CUDA_WINDOW_ATTENTION=1 -> reached by shape '{CUBLAS}' with KNOWN_GOOD_ENV[0]",
    "cuBLAS path (>= 128 tokens)": f"DS4_CUDA_NO_WINDOW_ATTENTION=1 -> reached by shape '{ONLINE}' with KNOWN_GOOD_ENV[1]",
    "attention_prefill_mixed_kernel (512 wide, many tokens)": f"DS4_CUDA_NO_WINDOW_ATTENTION=1, DS4_CUDA_NO_CUBLAS_ATTENTION=1 -> reached by shape '{CUBLAS}' with KNOWN_GOOD_ENV[2]",
}
KNOWN_GOOD_ENV = [
    {"DS4_CUDA_WINDOW_ATTENTION": "1"},
    {"DS4_CUDA_NO_WINDOW_ATTENTION": "1"},
    {"DS4_CUDA_NO_WINDOW_ATTENTION": "1", "DS4_CUDA_NO_CUBLAS_ATTENTION": "1"},
]

SPEC = UnitSpec(
    unit="ds4_gpu_attention_prefill_static_mixed_heads_tensor",
    reference="reference.ds4_attention_ops.attention_prefill_static_mixed_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape(ONE, dims(1, 4)),
        Shape("8 tokens, ratio 4, 2 rows", dims(8, 4)),
        Shape(CUBLAS, dims(100, 4)),
        Shape("127 tokens, ratio 128, no row yet", dims(127, 128)),
        Shape("128 tokens, ratio 128, 1 row (visible to the last token only)", dims(128, 128)),
        Shape(ONLINE, dims(200, 4)),
        Shape("300 tokens, ratio 128, 2 rows (online; rows leave the window)", dims(300, 128)),
        Shape(ODD, dims(20, 3, window=6, n_head=3, head_dim=96)),
        Shape("1 token, ratio 4, scores +200", I.shifted(dims(1, 4)), edge=I.EDGE_SHIFTED),
        Shape("100 tokens, ratio 4, scores +200 (cuBLAS path)", I.shifted(dims(100, 4)), edge=I.EDGE_SHIFTED),
        Shape("200 tokens, ratio 4, scores +200 (online path)", I.shifted(dims(200, 4)), edge=I.EDGE_SHIFTED),
        # untimed since the 2048-token chunks below time the same kernel at the size ds4 calls
        Shape("prefill, ratio-4 layer: 512 tokens, 128 rows", dims(512, 4)),
        # a fresh prompt's first 2048-token chunk (ds4.c's prefill chunk): 512 rows on a ratio-4 layer (no
        # top-k below 513 rows), 16 on a ratio-128 layer
        Shape("prefill chunk, ratio-4 layer: 2048 tokens, 512 rows (timing)", dims(2048, 4), timed=True),
        Shape("prefill chunk, ratio-128 layer: 2048 tokens, 16 rows (timing)", dims(2048, 128), timed=True),
        Shape("error: ratio 0", dims(8, 4) | {"ratio": 0}, expect="error", why="visibility divides by ratio"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
