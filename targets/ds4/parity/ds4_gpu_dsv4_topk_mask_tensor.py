"""Parity spec: ds4_gpu_dsv4_topk_mask_tensor (the sparse-attention mask of the
indexer's choice: mask[t][c] = 0 where c is among topk[t][0..top_k), else -inf).

ds4 builds it from the top 512 (DS4_N_INDEXER_TOP_K) of n_comp compressed rows,
n_comp growing with the context (context / 4), for one decode token or a prompt
batch.  The selections are random distinct rows, always including row 0 and
row n_comp - 1; rows are distinct, so a scan that stops one slot early leaves
one chosen row at -inf; n_comp > top_k leaves most of each row at -inf.  Exact:
the output holds only 0 and -inf."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref
from reference import ds4_ops as ops

K = ops.INDEXER_TOP_K

# upstream host function ds4_gpu_dsv4_topk_mask_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "topk_mask_kernel": "always (grid over max(n_tokens * n_comp, n_tokens * top_k)) -> reached by shape "
                        "'decode: 1 token, top 512 of 1024'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_comp, n_tokens, top_k = d["n_comp"], d["n_tokens"], d["top_k"]
    sel = np.zeros((n_tokens, top_k), np.int32)
    for t in range(n_tokens if n_comp >= top_k > 0 else 0):
        rows = rng.permutation(n_comp)[:top_k]
        if top_k < n_comp:  # the first and the last compressed row are always chosen, in random slots
            rows = np.concatenate([[0, n_comp - 1], rows[(rows != 0) & (rows != n_comp - 1)][: top_k - 2]])
        sel[t] = rng.permutation(rows)
    short = d.get("mask_short", 0)
    args = {"mask": Out("f32", (n_tokens * n_comp - short,) if short else (n_tokens, n_comp)), "topk": In(sel), "n_comp": n_comp, "n_tokens": n_tokens,
            "top_k": top_k}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"mask": ref.dsv4_topk_mask(sel, n_comp, n_tokens, top_k)})


SPEC = UnitSpec(
    unit="ds4_gpu_dsv4_topk_mask_tensor",
    reference="reference.ds4_hc_ops.dsv4_topk_mask",
    inputs="top-k selections of distinct row indices (integers): no floating-point inputs",
    outputs={"mask": Tol(nmse=0.0, max_err_rms=0.0, max_abs=0.0)},
    shapes=[
        Shape("decode: 1 token, top 512 of 1024", {"n_tokens": 1, "n_comp": 1024, "top_k": K}),
        Shape("3 tokens, top 512 of 2000", {"n_tokens": 3, "n_comp": 2000, "top_k": K}),
        Shape("top 511 of 512 (one row masked), 2 tokens", {"n_tokens": 2, "n_comp": K, "top_k": K - 1}),
        Shape("odd: 5 tokens, top 7 of 37", {"n_tokens": 5, "n_comp": 37, "top_k": 7}),
        Shape("prefill: 64 tokens, top 512 of 4096", {"n_tokens": 64, "n_comp": 4096, "top_k": K}, timed=True),
        Shape("error: top_k 0", {"n_tokens": 1, "n_comp": 64, "top_k": 0}, expect="error",
              why="n_comp, n_tokens and top_k must be non-zero"),
        Shape("error: mask smaller than n_tokens x n_comp", {"n_tokens": 2, "n_comp": 64, "top_k": 4, "mask_short": 1},
              expect="error", why="mask must hold n_tokens x n_comp floats"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_tokens"] * (s.dims["n_comp"] + s.dims["top_k"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
