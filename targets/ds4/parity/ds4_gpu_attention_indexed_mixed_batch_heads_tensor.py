"""Parity spec: ds4_gpu_attention_indexed_mixed_batch_heads_tensor (decode tokens over the
raw ring plus the compressed rows the indexer selected: topk[t] names top_k rows,
in the indexer's (score) order; rows not yet visible to the token -- index >=
(pos0 + t + 1) / ratio -- are skipped; per-head sinks).

ds4 ratio-4 layers select 512 rows.  Upstream sorts each token's 512 indices
first (batches only), runs an online kernel of 16 heads per block for
batches of 512-wide heads, a two-pass 8-head kernel behind
DS4_CUDA_INDEXED_TWOPASS, and a per-(token, head) kernel for one token or
other widths.  The shapes: one decode token, batches with top_k 512 and
smaller, tokens with fewer visible rows than top_k (the selection then
names invisible rows too, as the indexer's top-k does), odd sizes; top_k >
512 is refused.

The selections are what ds4's indexer produces (top_k <= n_comp; a token's
selection is inside its visible rows whenever it has top_k of them):
upstream's batched kernels rely on that -- they take the first
min(top_k, visible) entries of the sorted selection without checking them --
so a selection ds4 cannot produce (say, an invisible row picked over a
visible one) is not a fair case.

Tolerance: as for attention_decode_heads."""
from porter.spec import Call, Shape, Tol, UnitSpec, sibling

I = sibling(__file__, "_attn_inputs")
KIND = "indexed"


def build(shape, ctx, rng):
    args, ref = I.attention_call(KIND, shape, rng)
    return Call(args=args) if ref is None else Call(args=args, expect={"heads": ref})


def dims(n_tokens, pos0, n_comp, top_k=512, ratio=4, n_raw=128, raw_start=0, raw_cap=128, window=128, n_head=64,
         head_dim=512):
    return {"n_tokens": n_tokens, "pos0": pos0, "n_raw": n_raw, "raw_cap": raw_cap, "raw_start": raw_start,
            "n_comp": n_comp, "top_k": top_k, "ratio": ratio, "window": window, "n_head": n_head,
            "head_dim": head_dim}


ONE = "decode: 1 token at 8191, 2048 rows, top 512"
BATCH = "batch: 4 tokens at 8190, 2048 rows, top 512 (sorted, online 16-head kernel)"
SMALLK = "batch: 3 tokens at 4000, 1000 rows, top 100 (no sort)"

DISPATCH = {
    "attention_indexed_mixed_kernel": f"n_tokens 1 -> reached by shape '{ONE}'",
    "indexed_topk_sort_512_asc_kernel": f"n_tokens > 1 and top_k 512 -> reached by shape '{BATCH}'",
    "attention_indexed_mixed_heads8_online_kernel<8, 16>": f"n_tokens > 1, head_dim 512 -> reached by shape '{BATCH}'",
    "attention_indexed_mixed_heads8_online_kernel<8, 16> (unsorted)": f"top_k < 512 -> reached by shape '{SMALLK}'",
    "attention_indexed_mixed_kernel (odd width)": "head_dim != 512 -> reached by shape "
                                                  "'odd: 3 heads x 96, 4 tokens at 40, 12 rows, top 6, ratio 3'",
    "attention_indexed_mixed_heads8_rb4_kernel": f"DS4_CUDA_INDEXED_TWOPASS=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[0]",
    "attention_indexed_mixed_kernel (batch)": f"DS4_CUDA_NO_INDEXED_HEADS8=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[1]",
    "unsorted top 512": f"DS4_CUDA_NO_INDEXED_TOPK_SORT=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[2]",
}
# The sort is not needed for correctness with ds4's selections: the batched kernels take the
# first min(top_k, visible) entries unchecked, and the indexer ranks every visible row (finite
# score) before the invisible ones (-inf), sorted or not.  tests/test_ds4_attention_host.py
# runs a stand-in that reads the selection that way.
KNOWN_GOOD_ENV = [{"DS4_CUDA_INDEXED_TWOPASS": "1"}, {"DS4_CUDA_NO_INDEXED_HEADS8": "1"},
                  {"DS4_CUDA_NO_INDEXED_TOPK_SORT": "1"}]

SPEC = UnitSpec(
    unit="ds4_gpu_attention_indexed_mixed_batch_heads_tensor",
    reference="reference.ds4_attention_ops.attention_indexed_mixed_batch_heads",
    inputs=I.ATTENTION_INPUTS,
    outputs={"heads": Tol(**I.ATTN_TOL)},
    shapes=[
        Shape(ONE, dims(1, 8191, 2048, raw_start=9)),
        Shape(BATCH, dims(4, 8190, 2048, raw_start=120)),
        Shape("batch: 2 tokens at 2046, 512 rows, top 512 (row 511 visible to token 1 only)", dims(2, 2046, 512)),
        Shape(SMALLK, dims(3, 4000, 1000, top_k=100, raw_start=5)),
        Shape("batch: 6 tokens at 40, 11 rows, top 11 (rows appear mid-batch; invisible ones named last)",
              dims(6, 40, 11, top_k=11, n_raw=46, raw_cap=128)),
        Shape("odd: 3 heads x 96, 4 tokens at 40, 12 rows, top 6, ratio 3",
              dims(4, 40, 12, top_k=6, ratio=3, n_raw=7, raw_start=2, raw_cap=9, window=5, n_head=3, head_dim=96)),
        Shape("1 token at 8191, top 512 of 2048, scores +200", I.shifted(dims(1, 8191, 2048, raw_start=9)), edge=I.EDGE_SHIFTED),
        Shape("batch: 4 tokens at 8190, top 512 of 2048, scores +200", I.shifted(dims(4, 8190, 2048, raw_start=120)), edge=I.EDGE_SHIFTED),
        Shape("decode batch, ratio-4 layer at 32k: 16 tokens at 32752, 8192 rows, top 512 (timing)",
              dims(16, 32752, 8192, raw_start=77), timed=True),
        # decode at depth: one token at 64k on a ratio-4 layer (ds4.c's decode step, top 512 of 16384 rows),
        # its 128 raw rows in the 2304-row ring the engine allocates for 2048-token prefill chunks
        Shape("decode, ratio-4 layer at 64k: 1 token at 65535, 16384 rows, top 512 (timing)",
              dims(1, 65535, 16384, raw_start=(65536 - 128) % 2304, raw_cap=2304), timed=True),
        # A later prefill chunk at ds4's working batch: 2048 tokens (ds4.c prefills in chunks of 2048), the raw
        # ring sized for a chunk plus the window (metal_graph_raw_cap_for_context: align_up(128 + 2048, 256) =
        # 2304 rows), the chunk's 2048 rows and the window of 128 before it live (n_raw 2176 and raw_start as
        # metal_graph_raw_span_for_batch and metal_graph_raw_start_for_span put them).
        # On a ratio-4 layer at 32k: top 512 of 8192 rows per token.
        Shape("prefill chunk, ratio-4 layer at 32k: 2048 tokens at 30720, top 512 of 8192 rows (timing)",
              dims(2048, 30720, 8192, n_raw=2176, raw_start=(32768 - 2176) % 2304, raw_cap=2304),
              timed=True),
        Shape("error: top_k 513", dims(2, 4000, 1000, top_k=513), expect="error", why="upstream selects at most 512 rows"),
        Shape("error: n_comp 0", dims(2, 4000, 0, top_k=4), expect="error", why="no compressed rows to index"),
    ],
    build=build,
    bytes_moved=I.attention_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
