"""Parity spec: ds4_gpu_hc_split_sinkhorn_tensor (decode each token's 24-value HC
control vector: 4 pre weights sigmoid(.) + eps, 4 post gates 2 sigmoid(.), and a
4 x 4 combine matrix: row softmax + eps, then Sinkhorn normalisation; scales [3]
and base [24] from the model map; rows = mix's size / 96).

ds4 runs it with n_hc 4, 20 iterations and eps 1e-6 on one decode token or every
token of a prompt batch.  The three scales differ and the combine logits are
uneven, so the Sinkhorn rounds still move the matrix at round 20: one round more
or less changes it by NMSE ~5e-9 (tests/test_ds4_hc_reference.py), far above
the bound.  Cases with 1 and 3 iterations and with eps 0.1 make the iteration
count and eps visible on their own; 300 rows need two blocks of 256.

Tolerance: ds4.c computes in float32 with expf; a float32 emulation of it sits
within NMSE 6e-15 and 2e-7 of the RMS of this float64 reference."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_hc_split_sinkhorn_tensor (ds4_cuda.cu): n_hc must be 4; one launch
DISPATCH = {
    "hc_split_sinkhorn_kernel": "n_hc == 4 (one thread per row, blocks of 256) -> reached by shape "
                                "'300 rows (two blocks of 256), 20 iterations'",
}
TOL = Tol(nmse=1e-11, max_err_rms=2e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n_rows, n_hc, iters, eps = d["n_rows"], d["n_hc"], d["iters"], d["eps"]
    scale, base = hc.hc_params(rng)
    m, (s_off, b_off) = hc.weight_map(rng, [scale, base])
    if d.get("past_end"):
        b_off = hc.past_end(m, base.nbytes)
    mix = hc.hc_mix(rng, n_rows, comb_shift=d.get("comb_shift", 0.0))
    args = {"out": Out("f32", (n_rows, hc.MIX)), "mix": In(mix), "model_map": m, "model_size": m.size,
            "scale_offset": s_off, "base_offset": b_off, "n_hc": n_hc, "sinkhorn_iters": iters, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.hc_split_sinkhorn(mix, m.array, s_off, b_off, n_hc, iters, eps,
                                                                n_rows)})


def dims(n_rows, iters=hc.SINKHORN_ITERS, eps=hc.HC_EPS, n_hc=hc.N_HC, **kw):
    return {"n_rows": n_rows, "iters": iters, "eps": eps, "n_hc": n_hc, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_hc_split_sinkhorn_tensor",
    reference="reference.ds4_hc_ops.hc_split_sinkhorn",
    inputs=hc.HC_INPUTS + "; edge: combine logits shifted to ~100-130",
    outputs={"out": TOL},
    shapes=[
        Shape("decode: 1 token, 20 iterations", dims(1)),
        Shape("7 tokens, 20 iterations", dims(7)),
        Shape("300 rows (two blocks of 256), 20 iterations", dims(300)),
        Shape("1 iteration (no Sinkhorn round after the first), 5 tokens", dims(5, 1)),
        Shape("3 iterations, 4 tokens", dims(4, 3)),
        Shape("eps 0.1, 3 tokens", dims(3, eps=0.1)),
        Shape("7 tokens, combine logits ~100-130", dims(7, comb_shift=hc.COMB_SHIFT), edge=hc.EDGE_COMB_SHIFT),
        Shape("300 rows, combine logits ~100-130", dims(300, comb_shift=hc.COMB_SHIFT), edge=hc.EDGE_COMB_SHIFT),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens, 20 iterations", dims(64)),
        Shape("prefill chunk: 2048 tokens, 20 iterations", dims(2048), timed=True),
        Shape("error: n_hc 3", dims(2, n_hc=3), expect="error", why="the CUDA API supports ds4's 4 streams only"),
        Shape("error: base runs past the map", dims(1, past_end=True), expect="error",
              why="the [24] base must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * hc.MIX * s.dims["n_rows"] + 4 * (3 + hc.MIX),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
