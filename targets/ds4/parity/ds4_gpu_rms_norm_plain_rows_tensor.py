"""Parity spec: ds4_gpu_rms_norm_plain_rows_tensor (per-row x / sqrt(mean(x^2) + eps), no weight).
ds4 normalises the flattened hyper-connection state, hc_dim = 4096 x 4 = 16384
values per token, with eps 1e-6.  Rows get scales spread over two decades, so a
norm taken over the wrong row (or over all rows) shows."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_ops as ops

hc = sibling(__file__, "_hc_common")

HC_DIM = ops.N_EMBD * ops.N_HC


def build(shape, ctx, rng):
    d = shape.dims
    n, rows, eps = d["n"], d["rows"], d["eps"]
    x = hc.scaled_rows(rng, rows, n, near_zero=d.get("near_zero", False))
    return Call(args={"out": Out("f32", (rows, n)), "x": In(x), "n": n, "rows": rows, "eps": eps},
                expect={"out": ops.rms_norm_plain_rows(x, n, rows, eps)})


SPEC = UnitSpec(
    unit="ds4_gpu_rms_norm_plain_rows_tensor",
    reference="reference.ds4_ops.rms_norm_plain_rows",
    # float32 sum of squares over 16384 values: relative error ~1e-6 at worst
    inputs=hc.NORM_INPUTS,
    outputs={"out": Tol(nmse=1e-9, max_err_rms=1e-4)},
    shapes=[
        Shape("hc state, 1 token (16384)", {"n": HC_DIM, "rows": 1, "eps": ops.RMS_EPS}),
        Shape("hc state, 3 tokens", {"n": HC_DIM, "rows": 3, "eps": ops.RMS_EPS}),
        Shape("hc state, 7 tokens", {"n": HC_DIM, "rows": 7, "eps": ops.RMS_EPS}),
        Shape("near zero: hc state, 7 tokens", {"n": HC_DIM, "rows": 7, "eps": ops.RMS_EPS, "near_zero": True}, edge=hc.EDGE_NEAR_ZERO),
        Shape("odd n=33 x 5 rows", {"n": 33, "rows": 5, "eps": ops.RMS_EPS}),
        Shape("n=1 x 2 rows, eps 0.5 (eps matters)", {"n": 1, "rows": 2, "eps": 0.5}),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("hc state, 256 tokens (bandwidth)", {"n": HC_DIM, "rows": 256, "eps": ops.RMS_EPS}),
        Shape("prefill chunk: hc state, 2048 tokens", {"n": HC_DIM, "rows": 2048, "eps": ops.RMS_EPS}, timed=True),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n"] * s.dims["rows"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
