"""Parity spec: ds4_gpu_rms_norm_plain_tensor (one row: x / sqrt(mean(x^2) + eps), no weight).

ds4's decode graph normalises the flattened hyper-connection state, 4096 x 4 =
16384 values, with eps 1e-6, before the HC control projection.  Odd lengths
(33, 4097) leave a tail past any float4 / 256-thread stride; n = 1 and n = 3 with
eps 0.5 make eps a large part of the denominator, so a kernel that drops it is
off by tens of percent.

Tolerance: ds4.c sums squares in double, a kernel in float32 (a 256-way tree over
per-thread partials): the scale's relative error stays below ~1e-6, the worst
element (|x| ~ 4.5 rms) within ~5e-6 of the output RMS."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_rms_norm_plain_tensor (ds4_cuda.cu): one block of 256, no branch
DISPATCH = {
    "rms_norm_plain_kernel": "always (1 block x 256 threads, rows = 1) -> reached by shape 'decode: hc state 16384'",
}
TOL = Tol(nmse=1e-10, max_err_rms=3e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n, eps = d["n"], d["eps"]
    x = hc.scaled_rows(rng, 1, n, near_zero=d.get("near_zero", False))[0]
    args = {"out": Out("f32", (n,)), "x": In(x[: d.get("x_given", n)]), "n": n, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    if d.get("small"):
        x = (x / max(1e-30, float(abs(x).max())) * 0.3).astype(x.dtype)  # mean(x^2) well below eps
        args["x"] = In(x)
    return Call(args=args, expect={"out": ref.rms_norm_plain(x, n, eps)})


SPEC = UnitSpec(
    unit="ds4_gpu_rms_norm_plain_tensor",
    reference="reference.ds4_hc_ops.rms_norm_plain",
    inputs=hc.NORM_INPUTS,
    outputs={"out": TOL},
    shapes=[
        Shape("decode: hc state 16384", {"n": hc.HC_DIM, "eps": hc.RMS_EPS}, timed=True),
        Shape("4096 (one stream)", {"n": hc.N_EMBD, "eps": hc.RMS_EPS}),
        Shape("odd 4097 (tail)", {"n": hc.N_EMBD + 1, "eps": hc.RMS_EPS}),
        Shape("odd 33", {"n": 33, "eps": hc.RMS_EPS}),
        Shape("near zero: hc state 16384", {"n": hc.HC_DIM, "eps": hc.RMS_EPS, "near_zero": True}, edge=hc.EDGE_NEAR_ZERO),
        Shape("n=3, eps 0.5 dominates", {"n": 3, "eps": 0.5, "small": True}),
        Shape("n=1, eps 0.5", {"n": 1, "eps": 0.5}),
        Shape("error: x holds n-1 values", {"n": 64, "eps": hc.RMS_EPS, "x_given": 63}, expect="error",
              why="x must hold n floats"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
