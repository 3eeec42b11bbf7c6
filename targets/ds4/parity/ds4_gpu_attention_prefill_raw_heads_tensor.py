"""Parity spec: ds4_gpu_attention_prefill_raw_heads_tensor (a fresh prompt's sliding-window
attention: token t, 64 heads x 512, over raw rows max(0, t + 1 - window) .. t of
the n_tokens rows in raw_kv, one shared KV head, per-head sinks).

ds4 uses window 128 on layers without compression.  Upstream picks by token
count: 1 token -> a plain kernel, 2..127 -> cuBLAS (TF32) scores + softmax +
cuBLAS values, >= 128 -> an online-softmax kernel (8 heads per block), and a
plain kernel for widths other than 512.  The shapes sit on both sides of 128
and of the window (tokens 127/128/129 see 128 rows, token 128 drops row 0).
window 0 is left out: upstream's paths disagree on it (the cuBLAS and online
paths read it as no limit, the plain kernel as no rows) and ds4 never passes
it.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "prefill_raw"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, window=128, n_head=64, head_dim=512):
    return {"n_tokens": n_tokens, "window": window, "n_head": n_head, "head_dim": head_dim}


ONE = "1 token"
CUBLAS = "100 tokens, window 128 (cuBLAS path)"
ONLINE = "200 tokens, window 128 (online path; rows leave the window)"
ODD = "odd: 3 heads x 96, 40 tokens, window 5"

DISPATCH = {
    "attention_prefill_raw_kernel": f"n_tokens 1 -> reached by shape '{ONE}'",
    "attention_prefill_raw_kernel (odd width)": f"head_dim != 512 -> reached by shape '{ODD}'",
    "cublasSgemmStridedBatched + attention_prefill_raw_softmax_kernel": f"2 <= n_tokens < 128, head_dim 512 -> reached by shape '{CUBLAS}'",
    "attention_static_mixed_heads8_online_kernel": f"n_tokens >= 128, head_dim 512 -> reached by shape '{ONLINE}'",
    "attention_static_mixed_heads8_online_kernel (< 128 tokens)": f"DS4_CUDA_WINDOW_ATTENTION=1 -> reached by shape '{CUBLAS}' with KNOWN_GOOD_ENV[0]",
    "cublas path (>= 128 tokens)": f"DS4_CUDA_NO_WINDOW_ATTENTION=1 -> reached by shape '{ONLINE}' with KNOWN_GOOD_ENV[1]",
    "attention_prefill_raw_kernel (512 wide, many tokens)": f"DS4_CUDA_NO_WINDOW_ATTENTION=1 and DS4_CUDA_NO_CUBLAS_ATTENTION=1 -> reached by shape '{ONLINE}' with KNOWN_GOOD_ENV[2]",
}
KNOWN_GOOD_ENV = [
    {"DS4_CUDA_WINDOW_ATTENTION": "1"},
    {"DS4_CUDA_NO_WINDOW_ATTENTION": "1"},
    {"DS4_CUDA_NO_WINDOW_ATTENTION": "1", "DS4_CUDA_NO_CUBLAS_ATTENTION": "1"},
]

SPEC = UnitSpec(
    unit="ds4_gpu_attention_prefill_raw_heads_tensor",
    reference="reference.ds4_attention_ops.attention_prefill_raw_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape(ONE, dims(1)),
        Shape("7 tokens", dims(7)),
        Shape(CUBLAS, dims(100)),
        Shape("127 tokens (last below the online switch)", dims(127)),
        Shape("128 tokens (online switch)", dims(128)),
        Shape("129 tokens: token 128 drops row 0", dims(129)),
        Shape(ONLINE, dims(200)),
        Shape("50 tokens, window 1 (only itself)", dims(50, 1)),
        Shape(ODD, dims(40, 5, 3, 96)),
        Shape("1 token, scores +200", I.shifted(dims(1)), edge=I.EDGE_SHIFTED),
        Shape("100 tokens, scores +200 (cuBLAS path)", I.shifted(dims(100)), edge=I.EDGE_SHIFTED),
        Shape("200 tokens, scores +200 (online path)", I.shifted(dims(200)), edge=I.EDGE_SHIFTED),
        Shape("odd: 3 heads x 96, 40 tokens, scores +200", I.shifted(dims(40, 5, 3, 96)), edge=I.EDGE_SHIFTED),
        # untimed since the 2048-token chunk below times the same kernel at the size ds4 calls
        Shape("prefill: 256 tokens, window 128", dims(256)),
        # ds4.c prefills in chunks of 2048 tokens; a fresh prompt's first chunk on a raw layer comes here
        Shape("prefill chunk: 2048 tokens, window 128 (timing)", dims(2048), timed=True),
        Shape("error: window 257", dims(4, 257), expect="error", why="upstream holds at most 256 window rows"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
