"""Parity spec: ds4_gpu_attention_prefill_masked_mixed_heads_tensor (as
attention_prefill_static_mixed, plus comp_mask[t][c] added to the score of
compressed row c for token t: 0 keeps the row, -inf drops it -- the indexer's
top-k selection as ds4's topk-mask op writes it).

ds4's engine does not call it today (the planner ranks it unreachable), but
it is part of the API.  A masked call never takes upstream's online kernel:
2+ tokens of width 512 go through cuBLAS (TF32) and a masking softmax, one
token or other widths through a plain kernel.  Shapes: masks that keep a
few, most and all rows, a prefill over the window, odd sizes.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "prefill_masked"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, ratio, keep, n_comp=None, window=128, n_head=64, head_dim=512):
    return {"n_tokens": n_tokens, "ratio": ratio, "n_comp": n_tokens // ratio if n_comp is None else n_comp,
            "keep": keep, "window": window, "n_head": n_head, "head_dim": head_dim}


ONE = "1 token, ratio 4, 1 row (not yet visible)"
CUBLAS = "64 tokens, ratio 4, 16 rows, mask keeps 5"
ODD = "odd: 3 heads x 96, 21 tokens, window 4, ratio 3, 7 rows, mask keeps 3"

DISPATCH = {
    "attention_prefill_mixed_kernel": f"n_tokens 1 -> reached by shape '{ONE}'",
    "attention_prefill_mixed_kernel (odd width)": f"head_dim != 512 -> reached by shape '{ODD}'",
    "attention_prefill_pack_mixed_kv_kernel + cuBLAS + attention_prefill_mixed_softmax_kernel (masked)": f"n_tokens >= 2, head_dim 512 -> reached by shape '{CUBLAS}'",
    "attention_prefill_mixed_kernel (512 wide, many tokens)": f"DS4_CUDA_NO_CUBLAS_ATTENTION=1 -> reached by shape '{CUBLAS}' with KNOWN_GOOD_ENV[0]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_CUBLAS_ATTENTION": "1"}]

UNREACHABLE = {"attention_static_mixed_heads8_online_kernel":
               "the static (unmasked) online path: this op always passes use_comp_mask = 1"}

SPEC = UnitSpec(
    unit="ds4_gpu_attention_prefill_masked_mixed_heads_tensor",
    reference="reference.ds4_attention_ops.attention_prefill_masked_mixed_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape(ONE, dims(1, 4, 1, n_comp=1)),
        Shape(CUBLAS, dims(64, 4, 5)),
        Shape("100 tokens, ratio 4, 25 rows, mask keeps all", dims(100, 4, 25)),
        Shape("200 tokens, ratio 4, 50 rows, mask keeps 20 (masked: no online path)", dims(200, 4, 20)),
        Shape("256 tokens, ratio 128, 2 rows, mask keeps 1", dims(256, 128, 1)),
        Shape(ODD, dims(21, 3, 3, window=4, n_head=3, head_dim=96)),
        Shape("1 token, 1 row, scores +200", I.shifted(dims(1, 4, 1, n_comp=1)), edge=I.EDGE_SHIFTED),
        Shape("64 tokens, ratio 4, mask keeps 5, scores +200", I.shifted(dims(64, 4, 5)), edge=I.EDGE_SHIFTED),
        Shape("200 tokens, ratio 4, mask keeps 20, scores +200", I.shifted(dims(200, 4, 20)), edge=I.EDGE_SHIFTED),
        Shape("prefill, ratio-4 layer: 512 tokens, 128 rows, mask keeps 32 (timing)", dims(512, 4, 32), timed=True),
        Shape("error: ratio 0", dims(8, 4, 1) | {"ratio": 0}, expect="error", why="visibility divides by ratio"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
