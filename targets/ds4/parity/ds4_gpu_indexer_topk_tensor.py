"""Parity spec: ds4_gpu_indexer_topk_tensor (per token, the top_k of n_comp indexer
scores: indices in descending score order, equal scores -> lower index first).

ds4 asks for the top 512 compressed rows (DS4_N_INDEXER_TOP_K) out of n_comp =
context/4, so n_comp runs from hundreds to 262144 (ds4's 1M-token context): the
shapes cover n_comp <= 1024, <= 2048, < 4096, = 4096, <= 8192, > 8192 and
> 32768 (the sizes where a kernel switches strategy; see DISPATCH), odd sizes,
a small top_k, and rows whose scores take only a handful of values, so the tie
rule decides which indices make the cut and in which order (also across the
chunks of the chunked path).  A mismatch confined to equal scores is reported
as 'tie-rule'."""
import numpy as np

from porter.spec import Call, Exact, In, Out, Shape, UnitSpec, sibling
from reference import ds4_ops as ops

TIE_RULE = "descending score; equal scores rank the lower index first (ds4.c's strict '>' scan)"


INPUTS = ("scores ~ N(0, 3^2) per row; tie cases: scores of a few values; edge: heavy-tailed scores "
          "(Cauchy, scale 3) with every 97th at +-1e30")

# Heavy-tailed scores: most within a few units, some in the thousands, every 97th at +-1e30 (past
# f16's range, where keys narrowed to half precision collapse into ties).  Upstream ranks float32
# keys (topk_score_better, cub radix sort of the float bits), an order that holds for any finite
# value; no exact zeros (-0 and +0 compare equal but sort apart by bits) and no exact ties.
EDGE_TAILS = "heavy-tailed scores, every 97th at +-1e30 (past f16's range)"


def _heavy_tailed(rng, n_tokens, n_comp):
    s = rng.standard_cauchy((n_tokens, n_comp)) * 3.0
    far = (np.arange(n_comp) % 97 == 13)[None, :].repeat(n_tokens, 0)
    s[far] = rng.choice([-1.0, 1.0], int(far.sum())) * 1e30 * rng.uniform(0.5, 2.0, int(far.sum()))
    s = s.astype(np.float32)
    s[s == 0] = np.float32(1e-3)
    return s


def build(shape, ctx, rng):
    d = shape.dims
    n_comp, n_tokens, top_k = d["n_comp"], d["n_tokens"], d["top_k"]
    if d.get("levels"):  # heavy ties: scores drawn from a few values
        levels = np.sort(rng.standard_normal(d["levels"])).astype(np.float32)
        scores = levels[rng.integers(0, d["levels"], (n_tokens, n_comp))]
    elif d.get("tails"):
        scores = _heavy_tailed(rng, n_tokens, n_comp)
    else:
        scores = (rng.standard_normal((n_tokens, n_comp)) * 3.0).astype(np.float32)
    args = {"selected": Out("i32", (n_tokens, top_k)), "scores": In(scores), "n_comp": n_comp,
            "n_tokens": n_tokens, "top_k": top_k}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"selected": ops.indexer_topk(scores, n_comp, n_tokens, top_k)},
                keys={"selected": scores})


K = ops.INDEXER_TOP_K
TREE = "2 tokens, 32769 rows (9 chunks: tree merge, last chunk 1 row), top 512"

# upstream host function ds4_gpu_indexer_topk_tensor (ds4_cuda.cu); top_k 512 is ds4's, any other top_k
# takes the one-thread kernel
DISPATCH = {
    "indexer_topk_1024_kernel": "top_k 512, n_comp <= 1024 -> reached by shape 'decode: 1 token, 1024 rows, top 512'",
    "indexer_topk_pow2_kernel<2048>": "top_k 512, n_comp <= 2048 -> reached by shape '3 tokens, 2000 rows, top 512'",
    "indexer_topk_pow2_kernel<4096>": "top_k 512, 2048 < n_comp < 4096 -> reached by shape "
                                      "'odd: 2 tokens, 3001 rows, top 512'",
    "indexer_topk_8192_cub_kernel": "top_k 512, n_comp == 4096 or 4096 < n_comp <= 8192, when the device grants "
                                    "the cub sort its opt-in shared memory -> reached by shape "
                                    "'1 token, 6001 rows, top 512'",
    "indexer_topk_pow2_u16_kernel<8192>": "4096 < n_comp <= 8192 on a device whose opt-in shared memory per block "
                                          "is below cub::BlockRadixSort<uint64_t, 512, 16>'s (not an H100 / H200) "
                                          "-> no case: a device attribute, no size or knob reaches it",
    "indexer_topk_chunk_pow2_kernel<4096> + indexer_topk_merge_pow2_kernel<4096>":
        "top_k 512, n_comp > 8192 -> reached by shape '2 tokens, 10000 rows (beyond 8192), top 512'",
    "indexer_topk_tree_merge_pow2_kernel<4096>": f"n_comp > 8 chunks of 4096 (32768) -> reached by shape '{TREE}'",
    "indexer_topk_kernel (one thread)": "top_k != 512 -> reached by shape '5 tokens, 37 rows, top 5'",
}
# Not run as known-good variants: DS4_CUDA_NO_TOPK2048 / DS4_CUDA_NO_TOPK_CHUNKED send large rows to the
# one-thread insertion kernel (seconds per 262144-row token); DS4_CUDA_NO_TOPK1024 / DS4_CUDA_NO_TOPK8192 only
# move sizes onto kernels the shapes above already reach.

UNREACHABLE = {"indexer_topk_pow2_u16_kernel": "4096 < n_comp <= 8192 only on a device that refuses the cub "
                                                  "sort its opt-in shared memory (not an H100 / H200): no input reaches it"}

SPEC = UnitSpec(
    unit="ds4_gpu_indexer_topk_tensor",
    reference="reference.ds4_ops.indexer_topk",
    inputs=INPUTS,
    outputs={"selected": Exact(tie_rule=TIE_RULE, keys="scores")},
    shapes=[
        Shape("decode: 1 token, 1024 rows, top 512", {"n_tokens": 1, "n_comp": 1024, "top_k": K}),
        Shape("3 tokens, 2000 rows, top 512", {"n_tokens": 3, "n_comp": 2000, "top_k": K}),
        Shape("odd: 2 tokens, 3001 rows, top 512", {"n_tokens": 2, "n_comp": 3001, "top_k": K}),
        Shape("2 tokens, 4096 rows, top 512", {"n_tokens": 2, "n_comp": 4096, "top_k": K}),
        Shape("1 token, 6001 rows, top 512", {"n_tokens": 1, "n_comp": 6001, "top_k": K}),
        Shape("2 tokens, 10000 rows (beyond 8192), top 512", {"n_tokens": 2, "n_comp": 10000, "top_k": K}),
        Shape(TREE, {"n_tokens": 2, "n_comp": 32769, "top_k": K}),
        Shape("decode at ds4's 1M context: 1 token, 262144 rows (64 chunks, tree merge), top 512",
              {"n_tokens": 1, "n_comp": 262144, "top_k": K}),
        Shape("5 tokens, 37 rows, top 5", {"n_tokens": 5, "n_comp": 37, "top_k": 5}),
        Shape("heavy tails: 1 token, 1024 rows, top 512", {"n_tokens": 1, "n_comp": 1024, "top_k": K, "tails": True},
              edge=EDGE_TAILS),
        Shape("heavy tails: 2 tokens, 10000 rows, top 512",
              {"n_tokens": 2, "n_comp": 10000, "top_k": K, "tails": True}, edge=EDGE_TAILS),
        Shape("heavy tails: 3 tokens, 37 rows, top 5", {"n_tokens": 3, "n_comp": 37, "top_k": 5, "tails": True},
              edge=EDGE_TAILS),
        Shape("top_k = n_comp = 512, 1 token", {"n_tokens": 1, "n_comp": K, "top_k": K}),
        Shape("ties: 3 tokens, 1024 rows of 8 values, top 512", {"n_tokens": 3, "n_comp": 1024, "top_k": K,
                                                                  "levels": 8}),
        Shape("ties: 2 tokens, 2000 rows of 16 values, top 512", {"n_tokens": 2, "n_comp": 2000, "top_k": K,
                                                                   "levels": 16}),
        Shape("ties: 1 token, 4096 rows of 5 values, top 512", {"n_tokens": 1, "n_comp": 4096, "top_k": K,
                                                                 "levels": 5}),
        Shape("ties: 1 token, 40000 rows of 7 values (tree merge), top 512", {"n_tokens": 1, "n_comp": 40000,
                                                                               "top_k": K, "levels": 7}),
        Shape("ties: 4 tokens, 37 rows of 3 values, top 7", {"n_tokens": 4, "n_comp": 37, "top_k": 7, "levels": 3}),
        Shape("prefill: 7 tokens, 8192 rows, top 512 (timing)", {"n_tokens": 7, "n_comp": 8192, "top_k": K},
              timed=True),
        # ds4.c's working sizes: a later 2048-token prefill chunk at 32k (8192 rows per token), and one
        # decode token at 64k (16384 rows)
        Shape("prefill chunk at 32k: 2048 tokens, 8192 rows, top 512 (timing)",
              {"n_tokens": 2048, "n_comp": 8192, "top_k": K}, timed=True),
        Shape("decode at 64k: 1 token, 16384 rows, top 512 (timing)", {"n_tokens": 1, "n_comp": 16384, "top_k": K},
              timed=True),
        Shape("error: top_k > n_comp", {"n_tokens": 1, "n_comp": 100, "top_k": 101}, expect="error",
              why="top_k must not exceed n_comp"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_tokens"] * (s.dims["n_comp"] + s.dims["top_k"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
