"""Parity spec: ds4_gpu_output_hc_weights_tensor (the output head's stream weights:
w[t][h] = sigmoid(pre[t][h] * scale + base[h]) + eps; scale one float32 and base
[n_hc] in the model map; the token count is out's size / (n_hc * 4)).

ds4 calls it with n_hc 4 and eps 1e-6 on one decode token or a prompt batch.  The
scale is not 1 and base is not 0 (ignoring either is off); pre spans +-6, so
both tails of the sigmoid are used; one case has eps 0.25 (with eps 1e-6 a kernel
that drops eps is within float32 noise).  Tolerance: float32 expf and division,
a few ulps of values in (0, 1.25) (NMSE ~1e-13; bound 1e-11)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_output_hc_weights_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "output_hc_weights_kernel": "always (grid over n_tokens * n_hc) -> reached by shape 'decode: 1 token x 4 streams'",
}
TOL = Tol(nmse=1e-11, max_err_rms=1e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_hc, eps = d["n_tokens"], d["n_hc"], d["eps"]
    scale = np.array([rng.uniform(0.3, 0.8)], np.float32)
    base = (rng.standard_normal(max(n_hc, 1)) * 0.8).astype(np.float32)
    m, (s_off, b_off) = hc.weight_map(rng, [scale, base])
    if d.get("past_end"):
        b_off = hc.past_end(m, base.nbytes)
    pre = rng.uniform(-6.0, 6.0, (n_tokens, d.get("pre_hc", n_hc))).astype(np.float32)
    args = {"out": Out("f32", (n_tokens, max(n_hc, 1))), "pre": In(pre), "model_map": m, "model_size": m.size,
            "scale_offset": s_off, "base_offset": b_off, "n_hc": n_hc, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.output_hc_weights(pre, m.array, s_off, b_off, n_hc, eps, n_tokens)})


def dims(n_tokens, n_hc=hc.N_HC, eps=hc.HC_EPS, **kw):
    return {"n_tokens": n_tokens, "n_hc": n_hc, "eps": eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_output_hc_weights_tensor",
    reference="reference.ds4_hc_ops.output_hc_weights",
    inputs="pre values ~ U(-6, 6) (both tails of the sigmoid); scale ~ U(0.3, 0.8), base ~ N(0, 0.8^2)",
    outputs={"out": TOL},
    shapes=[
        Shape("decode: 1 token x 4 streams", dims(1)),
        Shape("7 tokens x 4 streams", dims(7)),
        Shape("eps 0.25: 3 tokens x 4", dims(3, eps=0.25)),
        Shape("odd: 5 tokens x 3 streams", dims(5, 3)),
        Shape("prefill: 64 tokens x 4 streams", dims(64), timed=True),
        Shape("error: n_hc 0", dims(2, 0), expect="error", why="n_hc must be non-zero"),
        Shape("error: pre holds fewer values than out", dims(3, pre_hc=2), expect="error",
              why="pre must hold n_tokens * n_hc values"),
        Shape("error: base runs past the map", dims(1, past_end=True), expect="error",
              why="the [n_hc] base must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_tokens"] * s.dims["n_hc"] + 4 * (s.dims["n_hc"] + 1),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
