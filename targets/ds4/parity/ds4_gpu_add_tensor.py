"""Parity spec: ds4_gpu_add_tensor (out = a + b over n float32 values).

ds4 adds the shared-expert and routed-expert outputs (4096 per decode token,
n_tokens x 4096 in a prompt batch) and, in the MTP draft, two HC states (16384).
Odd sizes (1, 1000, 16385) leave a partial last block.  One float32 addition per
element has one correct rounding, so the comparison is bit-exact."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_add_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "add_kernel": "always (ceil(n / 256) blocks) -> reached by shape 'decode: ffn out 4096'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n = d["n"]
    a = hc.scaled_rows(rng, 1, n)[0]
    b = hc.scaled_rows(rng, 1, n)[0]
    args = {"out": Out("f32", (n,)), "a": In(a), "b": In(b[: d.get("b_given", n)]), "n": n}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.add(a, b, n)})


SPEC = UnitSpec(
    unit="ds4_gpu_add_tensor",
    reference="reference.ds4_hc_ops.add",
    inputs=hc.HC_INPUTS,
    outputs={"out": Tol(nmse=0.0, max_err_rms=0.0, max_abs=0.0)},
    shapes=[
        Shape("decode: ffn out 4096", {"n": hc.N_EMBD}),
        Shape("MTP: hc state 16384", {"n": hc.HC_DIM}),
        Shape("odd 16385", {"n": hc.HC_DIM + 1}),
        Shape("odd 1000", {"n": 1000}),
        Shape("n = 1", {"n": 1}),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 4096", {"n": 64 * hc.N_EMBD}),
        Shape("prefill chunk: 2048 tokens x 4096", {"n": 2048 * hc.N_EMBD}, timed=True),
        Shape("error: b holds n-1 values", {"n": 300, "b_given": 299}, expect="error", why="a and b must hold n floats"),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
