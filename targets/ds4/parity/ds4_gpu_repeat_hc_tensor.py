"""Parity spec: ds4_gpu_repeat_hc_tensor (one [n_embd] row copied into n_hc streams:
out [n_hc][n_embd]).

ds4's MTP draft repeats its 4096-wide embedding projection into the 4 HC streams
(decode).  Odd sizes (37 x 3, 4097 x 4, 1 x 1) leave partial blocks.  A copy is
exact, so the comparison is bit-exact."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_repeat_hc_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "repeat_hc_kernel": "always (grid over n_embd * n_hc) -> reached by shape 'decode (MTP): 4096 x 4 streams'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_embd, n_hc = d["n_embd"], d["n_hc"]
    row = hc.scaled_rows(rng, 1, n_embd)[0]
    args = {"out": Out("f32", (max(n_hc, 1), n_embd)), "row": In(row[: d.get("row_given", n_embd)]),
            "n_embd": n_embd, "n_hc": n_hc}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.repeat_hc(row, n_embd, n_hc)})


SPEC = UnitSpec(
    unit="ds4_gpu_repeat_hc_tensor",
    reference="reference.ds4_hc_ops.repeat_hc",
    inputs=hc.HC_INPUTS,
    outputs={"out": Tol(nmse=0.0, max_err_rms=0.0, max_abs=0.0)},
    shapes=[
        Shape("decode (MTP): 4096 x 4 streams", {"n_embd": hc.N_EMBD, "n_hc": hc.N_HC}, timed=True),
        Shape("odd: 37 x 3 streams", {"n_embd": 37, "n_hc": 3}),
        Shape("odd: 4097 x 4 streams", {"n_embd": hc.N_EMBD + 1, "n_hc": hc.N_HC}),
        Shape("1 x 1", {"n_embd": 1, "n_hc": 1}),
        Shape("error: n_hc 0", {"n_embd": 64, "n_hc": 0}, expect="error", why="n_hc must be non-zero"),
        Shape("error: row holds n_embd-1 values", {"n_embd": 64, "n_hc": 4, "row_given": 63}, expect="error",
              why="row must hold n_embd floats"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_embd"] * (1 + s.dims["n_hc"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
