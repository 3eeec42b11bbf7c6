"""Parity spec: ds4_gpu_hc_split_weighted_sum_norm_tensor (ds4's decode HC pre step
fused with the sublayer norm: split and out as in ds4_gpu_hc_split_weighted_sum_tensor,
and norm_out = rms_norm(out) * w, w the float32 [n_embd] attn/ffn norm weight in
the map, norm_eps its own eps).

ds4 calls it for one decode token (n_hc 4, 4096 wide, 20 iterations, eps 1e-6,
norm_eps 1e-6).  All three outputs are compared.  One case has norm_eps 0.5 with
a small residual (eps 1e-6 vs a norm_eps that matters: a kernel that swaps them
is off); odd width 37 and 4097 leave tails.  Tolerance: out/split as in the
split spec, norm_out as the RMS norm specs.

Upstream: with one row the fused kernel runs; DS4_CUDA_DISABLE_HC_SPLIT_NORM_FUSED
takes the unfused path (split_weighted_sum + rms_norm_weight) instead, and the
spec must pass there too (KNOWN_GOOD_ENV).  With more than one row upstream also
takes the unfused path, but its norm call normalises only row 0 and leaves the
other rows of norm_out unwritten, so the spec has no multi-row case (ds4 only
calls it for one token)."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_hc_split_weighted_sum_norm_tensor (ds4_cuda.cu)
DISPATCH = {
    "hc_split_weighted_sum_norm_fused_kernel": "DS4_CUDA_DISABLE_HC_SPLIT_NORM_FUSED unset and one row -> reached by "
                                               "shape 'decode: 1 token x 4 x 4096'",
    "hc_split_weighted_sum_fused_kernel": "env DS4_CUDA_DISABLE_HC_SPLIT_NORM_FUSED set (or rows > 1: not in the "
                                          "spec, upstream leaves norm_out rows 1.. unwritten) -> reached by every "
                                          "shape under KNOWN_GOOD_ENV[0]",
    "rms_norm_weight_kernel": "env DS4_CUDA_DISABLE_HC_SPLIT_NORM_FUSED set, after the split kernel -> reached by "
                              "every shape under KNOWN_GOOD_ENV[0]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_DISABLE_HC_SPLIT_NORM_FUSED": "1"}]
TOL_SPLIT = Tol(nmse=1e-11, max_err_rms=2e-5)
TOL_NORM = Tol(nmse=1e-10, max_err_rms=3e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n_embd, iters, norm_eps = d["n_embd"], d["iters"], d["norm_eps"]
    scale, base = hc.hc_params(rng)
    w = hc.norm_weight(rng, n_embd)
    m, (s_off, b_off, w_off) = hc.weight_map(rng, [scale, base, w])
    if d.get("past_end"):
        w_off = hc.past_end(m, w.nbytes)
    mix = hc.hc_mix(rng, 1, comb_shift=d.get("comb_shift", 0.0))
    x = hc.scaled_rows(rng, hc.N_HC, n_embd, *d.get("scale", (0.1, 10.0))).reshape(1, hc.N_HC, n_embd)
    args = {"out": Out("f32", (1, n_embd)), "norm_out": Out("f32", (1, d.get("norm_width", n_embd))),
            "split": Out("f32", (1, hc.MIX)), "mix": In(mix), "residual_hc": In(x), "model_map": m,
            "model_size": m.size, "scale_offset": s_off, "base_offset": b_off, "norm_weight_offset": w_off,
            "n_embd": n_embd, "n_hc": d.get("n_hc", hc.N_HC), "sinkhorn_iters": iters, "eps": hc.HC_EPS,
            "norm_eps": norm_eps}
    if shape.expect == "error":
        return Call(args=args)
    out, norm, split = ref.hc_split_weighted_sum_norm(mix, x, m.array, s_off, b_off, w_off, n_embd, hc.N_HC, iters,
                                                      hc.HC_EPS, norm_eps, 1)
    return Call(args=args, expect={"out": out, "norm_out": norm, "split": split})


def dims(n_embd=hc.N_EMBD, iters=hc.SINKHORN_ITERS, norm_eps=hc.RMS_EPS, **kw):
    return {"n_embd": n_embd, "iters": iters, "norm_eps": norm_eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_hc_split_weighted_sum_norm_tensor",
    reference="reference.ds4_hc_ops.hc_split_weighted_sum_norm",
    inputs=hc.HC_INPUTS + "; edge: combine logits shifted to ~100-130",
    outputs={"out": TOL_SPLIT, "norm_out": TOL_NORM, "split": TOL_SPLIT},
    shapes=[
        Shape("decode: 1 token x 4 x 4096", dims(), timed=True),
        Shape("odd: 1 token x 4 x 37", dims(37)),
        Shape("1 token x 4 x 4096, combine logits ~100-130", dims(comb_shift=hc.COMB_SHIFT), edge=hc.EDGE_COMB_SHIFT),
        Shape("odd: 1 token x 4 x 4097", dims(hc.N_EMBD + 1)),
        Shape("3 iterations, 1 token x 4 x 4096", dims(iters=3)),
        Shape("norm_eps 0.5, small residual: 1 token x 4 x 64", dims(64, norm_eps=0.5, scale=(0.05, 0.2))),
        Shape("error: n_hc 3", dims(64, n_hc=3), expect="error", why="the CUDA API supports ds4's 4 streams only"),
        Shape("error: norm weight runs past the map", dims(256, past_end=True), expect="error",
              why="the [n_embd] norm weight must lie inside the model map"),
        Shape("error: norm_out smaller than out", dims(64, norm_width=63), expect="error",
              why="norm_out must hold every row of out"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * (s.dims["n_embd"] * (hc.N_HC + 3) + 2 * hc.MIX),
)
