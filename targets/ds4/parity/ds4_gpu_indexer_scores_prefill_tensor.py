"""Parity spec: ds4_gpu_indexer_scores_prefill_tensor (a fresh prompt's indexer scores:
token t at position t scores the compressed rows it can see, the first (t + 1) / ratio;
the rest are -inf).

ds4 prefill: 64 heads x 128, ratio 4, n_comp = n_tokens / 4 rows.  Upstream
sends one token to a one-token kernel and more to a tensor-core kernel that
works in tiles of 16 tokens x 128 rows and skips whole tiles beyond the
causal edge, so the shapes straddle 16-token and 128-row tiles (tails on both)
and hold tiles that are entirely, partly and not at all visible.

Tolerance: as for indexer_score_one (QAT'd values are exact in f16).  The
reference holds -inf where rows are not yet visible, which blinds NMSE and
the RMS-relative bound (the RMS is infinite), so the bound that does the work
is max|err| <= 1e-4 (scores are O(1)); a wrong -inf pattern is an infinite
error."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")
H, HD = A.INDEXER_HEADS, A.INDEXER_HEAD_DIM


def build(shape, ctx, rng):
    d = shape.dims
    q, w, k = I.indexer_inputs(rng, d)
    args = {"scores": Out("f32", (d["n_tokens"], d["n_comp"])), "q": In(q), "weights": In(w), "index_comp": In(k),
            "n_comp": d["n_comp"], "n_tokens": d["n_tokens"], "n_head": d["n_head"], "head_dim": d["head_dim"],
            "ratio": d["ratio"], "scale": I.INDEXER_SCALE}
    if shape.expect == "error":
        return Call(args=args)
    ref = A.indexer_scores_prefill(q, w, k, d["n_comp"], d["n_tokens"], d["n_head"], d["head_dim"], d["ratio"],
                                   I.INDEXER_SCALE)
    return Call(args=args, expect={"scores": ref})


def dims(n_tokens, n_comp=None, ratio=4, n_head=H, head_dim=HD, **kw):
    return {"n_tokens": n_tokens, "n_comp": n_tokens // ratio if n_comp is None else n_comp, "ratio": ratio,
            "n_head": n_head, "head_dim": head_dim, **kw}


ONE = "1 token, ratio 1, 3 rows (one-token kernel; rows 1, 2 not visible)"
TILES = "1000 tokens, 250 rows: 16-token and 128-row tiles with tails; whole tiles past the causal edge"
GENERIC = "odd: 3 heads x 96, 21 tokens, ratio 3, 7 rows (generic kernel)"

DISPATCH = {
    "indexer_score_one_direct_kernel": f"n_tokens 1, 64 x 128 -> reached by shape '{ONE}'",
    "indexer_scores_wmma128_kernel": f"n_tokens > 1, 64 x 128 -> reached by shape '{TILES}'",
    "indexer_scores_kernel": f"n_head / head_dim other than 64 / 128 -> reached by shape '{GENERIC}'",
    "indexer_scores_wmma64_kernel": f"DS4_CUDA_NO_INDEXER_WMMA128=1 -> reached by shape '{TILES}' with KNOWN_GOOD_ENV[0]",
    "indexer_scores_wmma32_kernel": f"WMMA128 and WMMA64 off -> reached by shape '{TILES}' with KNOWN_GOOD_ENV[1]",
    "indexer_scores_wmma_kernel": f"WMMA128, 64 and 32 off -> reached by shape '{TILES}' with KNOWN_GOOD_ENV[2]",
    "indexer_scores_kernel (64 x 128)": f"DS4_CUDA_NO_INDEXER_WMMA=1 -> reached by shape '{TILES}' with KNOWN_GOOD_ENV[3]",
}
KNOWN_GOOD_ENV = [
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1", "DS4_CUDA_NO_INDEXER_WMMA32": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA": "1"},
]

SPEC = UnitSpec(
    unit="ds4_gpu_indexer_scores_prefill_tensor",
    reference="reference.ds4_attention_ops.indexer_scores_prefill",
    inputs=I.INDEXER_INPUTS,
    outputs={"scores": Tol(nmse=1e-9, max_err_rms=1e-4, max_abs=1e-4)},
    shapes=[
        Shape(ONE, dims(1, 3, ratio=1)),
        Shape("16 tokens, 4 rows (one tile)", dims(16)),
        Shape("37 tokens, 9 rows (token tail)", dims(37)),
        Shape("300 tokens, 75 rows", dims(300)),
        Shape(TILES, dims(1000)),
        Shape("129 tokens, 200 rows (more rows than visible to any token)", dims(129, 200)),
        Shape(GENERIC, dims(21, 7, ratio=3, n_head=3, head_dim=96)),
        # untimed since the 2048-token chunk below times the same kernel at a larger size
        Shape("prefill: 512 tokens, 128 rows", dims(512)),
        # ds4's working batch: a fresh prompt's 2048-token chunk (ds4.c's prefill chunk) has 512 rows; ds4.c
        # calls this op only past top_k (513+ rows, a first chunk longer than 2048 via DS4_METAL_PREFILL_CHUNK),
        # and later chunks score through indexer_scores_decode_batch; this is the largest default-chunk size
        Shape("prefill chunk: 2048 tokens, 512 rows (timing)", dims(2048), timed=True),
        Shape("error: ratio 0", dims(8, 2, ratio=0) | {"n_comp": 2}, expect="error",
              why="the causal cut divides by ratio"),
        Shape("error: index_comp one row shorter than n_comp", dims(32, short_rows=True), expect="error",
              why="index_comp must hold n_comp rows"),
    ],
    build=build,
    bytes_moved=I.indexer_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
