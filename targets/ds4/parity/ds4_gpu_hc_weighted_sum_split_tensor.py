"""Parity spec: ds4_gpu_hc_weighted_sum_split_tensor (collapse the HC streams with
each token's pre weights, the first n_hc values of its split row:
out[t][d] = sum_h residual_hc[t][h][d] * split[t][h]; split rows are 2n + n^2
wide; the token count is out's size / n_embd).

ds4's prefill uses it with n_hc 4 (split rows of 24) and 4096-wide streams.  The
split rows are real Sinkhorn outputs (pre ~0.5, post ~1, combine ~0.25), so
reading post or combine values as weights, or a compact [t][n_hc] stride, is
off; 3 streams (rows of 15) and 37 wide leave odd tails.  Tolerance: as
ds4_gpu_hc_weighted_sum_tensor."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_hc_weighted_sum_split_tensor (ds4_cuda.cu): one launch, weight stride 2n + n^2
DISPATCH = {
    "hc_weighted_sum_kernel": "always (grid over n_tokens * n_embd, weight stride 2n + n^2) -> reached by shape "
                              "'prefill: 64 tokens x 4 x 4096'",
}
TOL = Tol(nmse=1e-11, max_err_rms=1e-5)


def split_rows(rng, n_tokens, n_hc):
    if n_hc == hc.N_HC:
        scale, base = hc.hc_params(rng)
        return ref.hc_split_sinkhorn_rows(hc.hc_mix(rng, n_tokens), scale, base, n_hc, hc.SINKHORN_ITERS,
                                          hc.HC_EPS).astype(np.float32)
    return rng.uniform(0.05, 1.5, (n_tokens, ref.mix_width(n_hc))).astype(np.float32)


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_embd, n_hc = d["n_tokens"], d["n_embd"], d["n_hc"]
    x = hc.scaled_rows(rng, n_tokens * n_hc, n_embd).reshape(n_tokens, n_hc, n_embd)
    split = split_rows(rng, n_tokens, n_hc)
    args = {"out": Out("f32", (n_tokens, n_embd)), "residual_hc": In(x), "split": In(split), "n_embd": n_embd,
            "n_hc": n_hc}
    if shape.expect == "error":
        args["n_hc"] = 0
        return Call(args=args)
    return Call(args=args, expect={"out": ref.hc_weighted_sum_split(x, split, n_embd, n_hc, n_tokens)})


def dims(n_tokens, n_embd=hc.N_EMBD, n_hc=hc.N_HC):
    return {"n_tokens": n_tokens, "n_embd": n_embd, "n_hc": n_hc}


SPEC = UnitSpec(
    unit="ds4_gpu_hc_weighted_sum_split_tensor",
    reference="reference.ds4_hc_ops.hc_weighted_sum_split",
    inputs=hc.HC_INPUTS,
    outputs={"out": TOL},
    shapes=[
        Shape("1 token x 4 x 4096", dims(1)),
        Shape("7 tokens x 4 x 4096", dims(7)),
        Shape("odd: 5 tokens x 3 streams (split rows of 15) x 37", dims(5, 37, 3)),
        Shape("odd: 3 tokens x 4 x 4097", dims(3, hc.N_EMBD + 1)),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 4 x 4096", dims(64)),
        Shape("prefill chunk: 2048 tokens x 4 x 4096", dims(2048), timed=True),
        Shape("error: n_hc 0", dims(2, 64), expect="error", why="n_hc must be non-zero"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_tokens"] * (s.dims["n_embd"] * (s.dims["n_hc"] + 1) + s.dims["n_hc"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
