"""Parity spec: ds4_gpu_indexer_scores_decode_batch_tensor (indexer scores of n_tokens
decode tokens at positions pos0 .. pos0 + n_tokens - 1: token t sees the first
(pos0 + t + 1) / ratio compressed rows, the rest are -inf).

Decode (1 token) and short batches (speculative / MTP steps) at contexts of a
few thousand, 64 x 128 heads, ratio 4: a token at position p with
(p + 1) % 4 == 0 is the one that makes a new row visible, so the shapes put
that edge inside the batch and inside a 128-row tile.  pos0 matters only
here (prefill starts at 0), so an implementation that ignores it is caught.

Tolerance: as for indexer_scores_prefill (max|err| carries the check where
the reference holds -inf)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")
H, HD = A.INDEXER_HEADS, A.INDEXER_HEAD_DIM


def build(shape, ctx, rng):
    d = shape.dims
    q, w, k = I.indexer_inputs(rng, d)
    args = {"scores": Out("f32", (d["n_tokens"], d["n_comp"])), "q": In(q), "weights": In(w), "index_comp": In(k),
            "n_comp": d["n_comp"], "n_tokens": d["n_tokens"], "pos0": d["pos0"], "n_head": d["n_head"],
            "head_dim": d["head_dim"], "ratio": d["ratio"], "scale": I.INDEXER_SCALE}
    if shape.expect == "error":
        return Call(args=args)
    ref = A.indexer_scores_decode_batch(q, w, k, d["n_comp"], d["n_tokens"], d["pos0"], d["n_head"], d["head_dim"],
                                        d["ratio"], I.INDEXER_SCALE)
    return Call(args=args, expect={"scores": ref})


def dims(n_tokens, pos0, n_comp, ratio=4, n_head=H, head_dim=HD, **kw):
    return {"n_tokens": n_tokens, "pos0": pos0, "n_comp": n_comp, "ratio": ratio, "n_head": n_head,
            "head_dim": head_dim, **kw}


ONE_ALL = "decode: 1 token at 4095, 1024 rows, all visible"
BATCH = "batch: 6 tokens at 4090, 1024 rows (row 1023 appears mid-batch)"
GENERIC = "odd: 3 heads x 96, 5 tokens at 10, 9 rows (generic kernel)"

DISPATCH = {
    "indexer_score_one_direct_kernel": f"n_tokens 1, 64 x 128 -> reached by shape '{ONE_ALL}'",
    "indexer_scores_wmma128_kernel": f"n_tokens > 1, 64 x 128 -> reached by shape '{BATCH}'",
    "indexer_scores_kernel": f"n_head / head_dim other than 64 / 128 -> reached by shape '{GENERIC}'",
    "indexer_scores_wmma128_kernel (n_tokens 1)": f"DS4_CUDA_NO_INDEXER_DIRECT_ONE=1 -> reached by shape '{ONE_ALL}' "
                                                  "with KNOWN_GOOD_ENV[0]",
    "indexer_scores_wmma64_kernel": f"DS4_CUDA_NO_INDEXER_WMMA128=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[1]",
    "indexer_scores_wmma32_kernel": f"WMMA128 and WMMA64 off -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[2]",
    "indexer_scores_wmma_kernel": f"WMMA128, 64 and 32 off -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[3]",
    "indexer_scores_kernel (64 x 128)": f"DS4_CUDA_NO_INDEXER_WMMA=1 -> reached by shape '{BATCH}' with KNOWN_GOOD_ENV[4]",
}
KNOWN_GOOD_ENV = [
    {"DS4_CUDA_NO_INDEXER_DIRECT_ONE": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1", "DS4_CUDA_NO_INDEXER_WMMA32": "1"},
    {"DS4_CUDA_NO_INDEXER_WMMA": "1"},
]

SPEC = UnitSpec(
    unit="ds4_gpu_indexer_scores_decode_batch_tensor",
    reference="reference.ds4_attention_ops.indexer_scores_decode_batch",
    inputs=I.INDEXER_INPUTS,
    outputs={"scores": Tol(nmse=1e-9, max_err_rms=1e-4, max_abs=1e-4)},
    shapes=[
        Shape(ONE_ALL, dims(1, 4095, 1024)),
        Shape("decode: 1 token at 4001, 1024 rows (rows 1000.. not yet visible)", dims(1, 4001, 1024)),
        Shape(BATCH, dims(6, 4090, 1024)),
        Shape("batch: 17 tokens at 500, 200 rows (token-tile tail; 128-row tile edge at 127)", dims(17, 500, 200)),
        Shape("batch: 2 tokens at 2, 1 row (visible to token 1 only)", dims(2, 2, 1)),
        Shape(GENERIC, dims(5, 10, 9, n_head=3, head_dim=96)),
        Shape("decode batch: 16 tokens at 8176, 2048 rows (timing)", dims(16, 8176, 2048), timed=True),
        # a later prefill chunk at ds4's working batch (2048 tokens; ds4.c scores every chunk after the first
        # here) on a ratio-4 layer at 32k: 8192 rows
        Shape("prefill chunk at 32k: 2048 tokens at 30720, 8192 rows (timing)", dims(2048, 30720, 8192),
              timed=True),
        Shape("error: ratio 0", dims(2, 100, 8, ratio=0), expect="error", why="the causal cut divides by ratio"),
        Shape("error: index_comp one row shorter than n_comp", dims(2, 100, 20, short_rows=True), expect="error",
              why="index_comp must hold n_comp rows"),
    ],
    build=build,
    bytes_moved=I.indexer_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
