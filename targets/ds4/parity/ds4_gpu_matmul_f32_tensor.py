"""Parity spec: ds4_gpu_matmul_f32_tensor (out[t][o] = sum_i W[o][i] x[t][i], W F32).

ds4 uses it where a model stores a control projection as F32 (the census
names mtp.0.hc_head_fn, 16384 -> 4, F16 or F32; a model with an F16 tensor
there gives this case a synthetic F32 stand-in).  Real sizes beside it are the
HC and router widths (16384 -> 24, 4096 -> 256) at decode and prefill token
counts; odd sizes cover partial thread strides.

Reference: x and W in float64, no quantization (ds4.c's F32 matmul).
Tolerance: upstream's prefill path is cublasSgemm under TF32 tensor-op math
(ds4_gpu_init sets it unless DS4_CUDA_NO_TF32 or quality mode), which rounds
both operands to 10-bit mantissas: NMSE ~ 2 x 2^-22/3 ~ 2e-7 relative
(measured in tests/test_ds4_matmul_reference.py)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "matmul_f32_kernel": "n_tok == 1 -> reached by shape 'mtp hc_head_fn 16384->4, decode'",
    "cublasSgemm (TF32 tensor-op math)": "n_tok > 1 -> reached by shape 'hc 16384->24, 129 tokens'",
    "cublasSgemm (FP32 math)": "n_tok > 1 with DS4_CUDA_NO_TF32 (read once, in ds4_gpu_init) -> knob",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_TF32": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, in_dim, out_dim = d["n_tok"], d["in_dim"], d["out_dim"]
    m, (off,), _ = W.dense(shape, ctx, rng, [("F32", max(out_dim, 1), max(in_dim, 1))])
    W.mirror_if_cancelling(d, m, [off], out_dim, 4 * in_dim)
    x = W.activations(rng, d, (max(n_tok, 1), max(in_dim, 1)))
    args = {"out": Out("f32", (max(n_tok, 1), max(out_dim, 1))), "model_map": m, "model_size": m.size,
            "weight_offset": off, "in_dim": in_dim, "out_dim": out_dim, "x": In(x), "n_tok": n_tok}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": mo.matmul_f32(m.array, off, in_dim, out_dim, x, n_tok)})


def _s(label, n_tok, in_dim, out_dim, tensor=None, **kw):
    return Shape(label, {"n_tok": n_tok, "in_dim": in_dim, "out_dim": out_dim, **kw.pop("dims", {})},
                 source=f"model:{tensor}" if tensor else "synthetic", **kw)


SPEC = UnitSpec(
    unit="ds4_gpu_matmul_f32_tensor",
    reference="reference.ds4_matmul_ops.matmul_f32",
    inputs=W.INPUTS,
    outputs={"out": Tol(nmse=5e-6, max_err_rms=3e-2)},
    shapes=[
        _s("mtp hc_head_fn 16384->4, decode", 1, 16384, 4, "mtp.0.hc_head_fn.weight", timed=True),
        _s("mtp hc_head_fn 16384->4, 2 tokens", 2, 16384, 4, "mtp.0.hc_head_fn.weight"),
        _s("hc 16384->24, 129 tokens", 129, 16384, 24),
        _s("router width 4096->256, decode", 1, 4096, 256),
        _s("router width 4096->256, 128 tokens", 128, 4096, 256, timed=True),
        _s("odd 1000->33, 3 tokens", 3, 1000, 33),
        _s("odd 7->3, decode (fewer values than threads)", 1, 7, 3),
        _s("edge: cancelling halves, router width 4096->256, decode", 1, 4096, 256, dims={"cancel": True},
           edge=W.CANCEL),
        _s("edge: cancelling halves, hc 16384->24, 129 tokens (TF32 cuBLAS)", 129, 16384, 24, dims={"cancel": True},
           edge=W.CANCEL),
        _s("edge: x x1e5, router width 4096->256, decode", 1, 4096, 256, dims={"x_scale": 1e5}, edge=W.HUGE),
        _s("edge: x x1e5, router width 4096->256, 3 tokens (TF32 cuBLAS)", 3, 4096, 256, dims={"x_scale": 1e5},
           edge=W.HUGE),
        _s("error: in_dim 0", 1, 0, 4, expect="error", why="upstream refuses an empty projection"),
        _s("error: n_tok 0", 0, 64, 4, expect="error", why="upstream refuses zero tokens"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["out_dim"] * s.dims["in_dim"]
    + 4 * s.dims["n_tok"] * (s.dims["in_dim"] + s.dims["out_dim"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
