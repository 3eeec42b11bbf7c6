"""Parity spec: ds4_gpu_indexer_score_one_tensor (one decode token's indexer score of
every compressed row: scale * sum_h relu(q_h . k_c) * w_h, no causal cut).

ds4's indexer has 64 heads x 128 and scores n_comp = context/4 rows; q and the
rows are Hadamard + FP4 QAT'd (reference.ds4_attention_ops), weights are the
projection of the token (here N(0, 1)), scale 1/sqrt(64 * 128).  64 x 128 takes
a dedicated one-token kernel upstream; other head counts / widths take the
generic one, so odd sizes are here too.

Tolerance: the QAT'd values are exact in f16, so every path (including the
tensor-core one behind DS4_CUDA_NO_INDEXER_DIRECT_ONE) only differs from the
float64 reference by float32 accumulation order (~1e-6 of a score of O(1)).
A dropped relu, a lost head or an ignored scale move scores by O(1)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")
H, HD = A.INDEXER_HEADS, A.INDEXER_HEAD_DIM


def build(shape, ctx, rng):
    d = shape.dims
    q, w, k = I.indexer_inputs(rng, d)
    args = {"scores": Out("f32", (1, d["n_comp"])), "q": In(q), "weights": In(w), "index_comp": In(k),
            "n_comp": d["n_comp"], "n_head": d["n_head"], "head_dim": d["head_dim"], "scale": I.INDEXER_SCALE}
    if shape.expect == "error":
        return Call(args=args)
    ref = A.indexer_score_one(q, w, k, d["n_comp"], d["n_head"], d["head_dim"], I.INDEXER_SCALE)
    return Call(args=args, expect={"scores": ref})


def dims(n_comp, n_head=H, head_dim=HD, **kw):
    return {"n_comp": n_comp, "n_head": n_head, "head_dim": head_dim, **kw}


DIRECT = "decode: 64 x 128 heads, 1000 rows (one-token kernel)"
GENERIC = "odd: 3 heads x 96, 37 rows (generic kernel)"

# Upstream ds4_cuda.cu indexer_scores_launch, for one token (causal off).
DISPATCH = {
    "indexer_score_one_direct_kernel": f"n_head 64 and head_dim 128 -> reached by shape '{DIRECT}'",
    "indexer_scores_kernel": f"any other n_head / head_dim -> reached by shape '{GENERIC}'",
    "indexer_scores_wmma128_kernel": f"64 x 128 under DS4_CUDA_NO_INDEXER_DIRECT_ONE=1 -> reached by shape '{DIRECT}' "
                                     "with KNOWN_GOOD_ENV[0]",
    "indexer_scores_wmma64_kernel": "64 x 128, DIRECT_ONE and WMMA128 off -> reached by shape "
                                    f"'{DIRECT}' with KNOWN_GOOD_ENV[1]",
    "indexer_scores_wmma32_kernel": f"64 x 128, WMMA64 also off -> reached by shape '{DIRECT}' with KNOWN_GOOD_ENV[2]",
    "indexer_scores_wmma_kernel": f"64 x 128, WMMA32 also off -> reached by shape '{DIRECT}' with KNOWN_GOOD_ENV[3]",
    "indexer_scores_kernel (64 x 128)": f"DIRECT_ONE off and DS4_CUDA_NO_INDEXER_WMMA=1 -> reached by shape '{DIRECT}' "
                                        "with KNOWN_GOOD_ENV[4]",
}
_OFF = {"DS4_CUDA_NO_INDEXER_DIRECT_ONE": "1"}
KNOWN_GOOD_ENV = [
    _OFF,
    {**_OFF, "DS4_CUDA_NO_INDEXER_WMMA128": "1"},
    {**_OFF, "DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1"},
    {**_OFF, "DS4_CUDA_NO_INDEXER_WMMA128": "1", "DS4_CUDA_NO_INDEXER_WMMA64": "1",
     "DS4_CUDA_NO_INDEXER_WMMA32": "1"},
    {**_OFF, "DS4_CUDA_NO_INDEXER_WMMA": "1"},
]

SPEC = UnitSpec(
    unit="ds4_gpu_indexer_score_one_tensor",
    reference="reference.ds4_attention_ops.indexer_score_one",
    inputs=I.INDEXER_INPUTS,
    outputs={"scores": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape(DIRECT, dims(1000)),
        Shape("64 x 128, 1 row", dims(1)),
        Shape("64 x 128, 4097 rows (one past a 128-row tile multiple)", dims(4097)),
        Shape(GENERIC, dims(37, 3, 96)),
        Shape("odd: 64 heads x 64, 129 rows (generic kernel)", dims(129, 64, 64)),
        Shape("decode at 32k context: 64 x 128, 8192 rows (timing)", dims(8192), timed=True),
        Shape("decode at 64k context: 64 x 128, 16384 rows (timing)", dims(16384), timed=True),
        Shape("error: index_comp one row shorter than n_comp", dims(100, short_rows=True), expect="error",
              why="index_comp must hold n_comp rows"),
    ],
    build=build,
    bytes_moved=I.indexer_bytes,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
