"""Parity spec: ds4_gpu_hc_split_weighted_sum_tensor (ds4's fused HC "pre" step: each
token's split (ds4_gpu_hc_split_sinkhorn_tensor) written to `split`, and the
streams collapsed with its pre weights into `out`; rows = out's size / (n_embd*4)).

ds4 calls it with n_hc 4, 4096-wide streams, 20 iterations, eps 1e-6 (decode: one
token; prefill: every token of a batch).  Both outputs are compared.  Odd widths
(37, 4097) leave tails past 256 threads; a 3-iteration case makes the iteration
count visible.  Tolerance: split as in the Sinkhorn spec; out inherits the
split's float32 noise (~1e-7 relative)."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_hc_split_weighted_sum_tensor (ds4_cuda.cu): n_hc must be 4; one launch
DISPATCH = {
    "hc_split_weighted_sum_fused_kernel": "n_hc == 4, out bytes a multiple of n_embd floats (one block of 256 per "
                                          "token) -> reached by shape 'decode: 1 token x 4 x 4096'",
}
TOL_OUT = Tol(nmse=1e-11, max_err_rms=2e-5)
TOL_SPLIT = Tol(nmse=1e-11, max_err_rms=2e-5)


def inputs(shape, rng):
    d = shape.dims
    n_rows, n_embd = d["n_rows"], d["n_embd"]
    scale, base = hc.hc_params(rng)
    return d, n_rows, n_embd, scale, base, hc.hc_mix(rng, n_rows, comb_shift=d.get("comb_shift", 0.0)), \
        hc.scaled_rows(rng, n_rows * hc.N_HC, n_embd).reshape(n_rows, hc.N_HC, n_embd)


def build(shape, ctx, rng):
    d, n_rows, n_embd, scale, base, mix, x = inputs(shape, rng)
    m, (s_off, b_off) = hc.weight_map(rng, [scale, base])
    out_shape = (n_rows * n_embd + 1,) if d.get("ragged_out") else (n_rows, n_embd)
    args = {"out": Out("f32", out_shape), "split": Out("f32", (n_rows, hc.MIX)), "mix": In(mix[: d.get("mix_rows", n_rows)]),
            "residual_hc": In(x), "model_map": m, "model_size": m.size, "scale_offset": s_off, "base_offset": b_off,
            "n_embd": n_embd, "n_hc": d.get("n_hc", hc.N_HC), "sinkhorn_iters": d["iters"], "eps": hc.HC_EPS}
    if shape.expect == "error":
        return Call(args=args)
    out, split = ref.hc_split_weighted_sum(mix, x, m.array, s_off, b_off, n_embd, hc.N_HC, d["iters"], hc.HC_EPS,
                                           n_rows)
    return Call(args=args, expect={"out": out, "split": split})


def dims(n_rows, n_embd=hc.N_EMBD, iters=hc.SINKHORN_ITERS, **kw):
    return {"n_rows": n_rows, "n_embd": n_embd, "iters": iters, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_hc_split_weighted_sum_tensor",
    reference="reference.ds4_hc_ops.hc_split_weighted_sum",
    inputs=hc.HC_INPUTS + "; edge: combine logits shifted to ~100-130",
    outputs={"out": TOL_OUT, "split": TOL_SPLIT},
    shapes=[
        Shape("decode: 1 token x 4 x 4096", dims(1), timed=True),
        # prefill too: ds4.c splits every token of its 2048-token prefill chunk here
        Shape("prefill chunk: 2048 tokens x 4 x 4096", dims(2048), timed=True),
        Shape("7 tokens x 4 x 4096", dims(7)),
        Shape("7 tokens x 4 x 4096, combine logits ~100-130", dims(7, comb_shift=hc.COMB_SHIFT), edge=hc.EDGE_COMB_SHIFT),
        Shape("odd: 5 tokens x 4 x 37", dims(5, 37)),
        Shape("odd: 2 tokens x 4 x 4097", dims(2, hc.N_EMBD + 1)),
        Shape("3 iterations: 3 tokens x 4 x 4096", dims(3, iters=3)),
        Shape("prefill: 64 tokens x 4 x 4096", dims(64)),
        Shape("error: n_hc 3", dims(2, 64, n_hc=3), expect="error", why="the CUDA API supports ds4's 4 streams only"),
        Shape("error: out is not a whole number of rows", dims(2, 64, ragged_out=True), expect="error",
              why="out must hold whole n_embd-wide rows"),
        Shape("error: mix holds fewer rows than out", dims(3, 64, mix_rows=2), expect="error",
              why="mix must hold a control vector per row of out"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_rows"] * (s.dims["n_embd"] * (hc.N_HC + 1) + 2 * hc.MIX),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
