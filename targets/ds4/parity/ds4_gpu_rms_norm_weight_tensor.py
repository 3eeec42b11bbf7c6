"""Parity spec: ds4_gpu_rms_norm_weight_tensor (one row: x / sqrt(mean(x^2) + eps) * w,
w the float32 [n] norm weight in the model map).

ds4's decode graph uses it for the attn/ffn/output norms (4096), the q LoRA norm
(1024), the kv norm (512) and the MTP enorm.  The weight lies in [0.25, 2]; odd n
(33, 4097) leave tails; n = 3 with eps 0.5 makes eps matter.  Tolerance: as
rms_norm_plain (float32 vs double sum of squares)."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_rms_norm_weight_tensor (ds4_cuda.cu): one block, no branch
DISPATCH = {
    "rms_norm_weight_kernel": "always (1 block x 256 threads, rows = 1) -> reached by shape 'decode: attn norm 4096'",
}
TOL = Tol(nmse=1e-10, max_err_rms=3e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n, eps = d["n"], d["eps"]
    w = hc.norm_weight(rng, n)
    m, (off,) = hc.weight_map(rng, [w])
    if d.get("past_end"):
        off = hc.past_end(m, w.nbytes)
    x = hc.scaled_rows(rng, 1, n, *d.get("scale", (0.1, 10.0)), near_zero=d.get("near_zero", False))[0]
    args = {"out": Out("f32", (n,)), "x": In(x), "model_map": m, "model_size": m.size, "weight_offset": off,
            "n": n, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.rms_norm_weight(x, m.array, off, n, eps)})


def dims(n, eps=hc.RMS_EPS, **kw):
    return {"n": n, "eps": eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_rms_norm_weight_tensor",
    reference="reference.ds4_hc_ops.rms_norm_weight",
    inputs=hc.NORM_INPUTS,
    outputs={"out": TOL},
    shapes=[
        Shape("decode: attn norm 4096", dims(hc.N_EMBD), timed=True),
        Shape("q LoRA norm 1024", dims(hc.N_LORA_Q)),
        Shape("kv norm 512", dims(512)),
        Shape("odd 33", dims(33)),
        Shape("near zero: attn norm 4096", dims(hc.N_EMBD, near_zero=True), edge=hc.EDGE_NEAR_ZERO),
        Shape("odd 4097", dims(hc.N_EMBD + 1)),
        Shape("eps 0.5 dominates: n=3, small x", dims(3, 0.5, scale=(0.05, 0.3))),
        Shape("error: weight runs past the map", dims(256, past_end=True), expect="error",
              why="the [n] norm weight must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 12 * s.dims["n"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
