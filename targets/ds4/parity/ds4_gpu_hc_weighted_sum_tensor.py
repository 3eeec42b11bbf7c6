"""Parity spec: ds4_gpu_hc_weighted_sum_tensor (collapse the HC streams:
out[t][d] = sum_h residual_hc[t][h][d] * weights[t][h]; the token count is
out's size / n_embd).

ds4 uses it for the output head (4 streams x 4096, weights = sigmoid(...) + eps per
token, so in (0, 1)) on one decode token or a prompt batch.  Each token has its
own weights, so a kernel that reuses token 0's shows; odd sizes (37 wide, 3
streams) leave tails.  Tolerance: four float32 products summed (FMA or not):
~1e-7 of the output RMS per element."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_hc_weighted_sum_tensor (ds4_cuda.cu): one launch, weight stride n_hc
DISPATCH = {
    "hc_weighted_sum_kernel": "always (grid over n_tokens * n_embd, n_tokens = out bytes / n_embd) -> "
                              "reached by shape 'prefill output head: 64 tokens x 4 x 4096'",
}
TOL = Tol(nmse=1e-11, max_err_rms=1e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_embd, n_hc = d["n_tokens"], d["n_embd"], d["n_hc"]
    x = hc.scaled_rows(rng, n_tokens * n_hc, n_embd).reshape(n_tokens, n_hc, n_embd)
    w = rng.uniform(0.05, 1.0, (n_tokens, n_hc)).astype("float32")
    args = {"out": Out("f32", (n_tokens, n_embd)), "residual_hc": In(x), "weights": In(w), "n_embd": n_embd,
            "n_hc": n_hc}
    if shape.expect == "error":
        args["n_embd"] = 0
        return Call(args=args)
    return Call(args=args, expect={"out": ref.hc_weighted_sum(x, w, n_embd, n_hc, n_tokens)})


def dims(n_tokens, n_embd=hc.N_EMBD, n_hc=hc.N_HC):
    return {"n_tokens": n_tokens, "n_embd": n_embd, "n_hc": n_hc}


SPEC = UnitSpec(
    unit="ds4_gpu_hc_weighted_sum_tensor",
    reference="reference.ds4_hc_ops.hc_weighted_sum",
    inputs=hc.HC_INPUTS,
    outputs={"out": TOL},
    shapes=[
        Shape("decode output head: 1 token x 4 x 4096", dims(1)),
        Shape("7 tokens x 4 x 4096", dims(7)),
        Shape("odd: 5 tokens x 3 streams x 37", dims(5, 37, 3)),
        Shape("odd: 2 tokens x 4 x 4097", dims(2, hc.N_EMBD + 1)),
        Shape("prefill output head: 64 tokens x 4 x 4096", dims(64), timed=True),
        Shape("error: n_embd 0", dims(2, 64), expect="error", why="n_embd must be non-zero"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_tokens"] * (s.dims["n_embd"] * (s.dims["n_hc"] + 1) + s.dims["n_hc"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
