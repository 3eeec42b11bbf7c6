"""Parity spec: ds4_gpu_hc_expand_split_tensor (the HC post step with post and comb
read from each token's split row: post at n_hc, comb at 2*n_hc, row stride
2n + n^2; tokens = out_hc's size / (n_hc * n_embd)).  Inputs:
targets/ds4/parity/_expand_common.py.

ds4's prefill calls it after attention (and after the FFN when there is no
routed output to add) for every token of a batch (n_hc 4, 4096 wide).
Tolerance: as ds4_gpu_hc_expand_tensor."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")
ex = sibling(__file__, "_expand_common")

# upstream host function ds4_gpu_hc_expand_split_tensor (ds4_cuda.cu): one launch, has_add 0, strides 2n + n^2
DISPATCH = {
    "hc_expand_kernel": "always (grid over n_tokens * n_hc * n_embd) -> reached by shape "
                        "'prefill: 64 tokens x 4 x 4096'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_embd, n_hc = d["n_tokens"], d["n_embd"], d["n_hc"]
    block, _, res, split = ex.tensors(hc, rng, n_tokens, n_embd, n_hc)
    args = {"out_hc": Out("f32", (n_tokens, n_hc, n_embd)), "block_out": In(block), "residual_hc": In(res),
            "split": In(split), "n_embd": n_embd, "n_hc": n_hc}
    if shape.expect == "error":
        args["n_hc"] = 0
        return Call(args=args)
    return Call(args=args, expect={"out_hc": ref.hc_expand_split(block, res, split, n_embd, n_hc, n_tokens)})


SPEC = UnitSpec(
    unit="ds4_gpu_hc_expand_split_tensor",
    reference="reference.ds4_hc_ops.hc_expand_split",
    inputs=hc.HC_INPUTS,
    outputs={"out_hc": Tol(nmse=1e-11, max_err_rms=1e-5)},
    shapes=[
        Shape("1 token x 4 x 4096", ex.dims(hc, 1)),
        Shape("7 tokens x 4 x 4096", ex.dims(hc, 7)),
        Shape("odd: 5 tokens x 3 streams (split rows of 15) x 37", ex.dims(hc, 5, 37, 3)),
        Shape("odd: 2 tokens x 4 x 4097", ex.dims(hc, 2, hc.N_EMBD + 1)),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 4 x 4096", ex.dims(hc, 64)),
        Shape("prefill chunk: 2048 tokens x 4 x 4096", ex.dims(hc, 2048), timed=True),
        Shape("error: n_hc 0", ex.dims(hc, 1, 64), expect="error", why="n_hc must be non-zero"),
    ],
    build=build,
    bytes_moved=lambda s: ex.moved(s, 1),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
