"""Parity spec: ds4_gpu_matmul_f16_tensor (out[t][o] = sum_i W[o][i] x[t][i], W F16).

ds4 reads F16 weights for its small control projections: the router
(ffn_gate_inp 4096 -> 256), the HC mixers (hc_*_fn 16384 -> 24, output_hc_fn
16384 -> 4), the compressors (4096 -> 1024 on ratio-4 layers, -> 512 on
ratio-128 layers) and the indexer (attn_q_b 1024 -> 8192, proj 4096 -> 64).
Those shapes name the real tensors (source "model:..."): the user's GGUF when
given, else random F16 of the same layout.  Odd sizes cover a last chunk that
is short or empty (upstream's decode kernel cuts in_dim into 32 chunks).

Reference: ds4.c's matvec_f16 (x stays float32).  Tolerance: upstream's
prefill path (n_tok > 1) converts x to F16 for cuBLAS, which moves the result
by the F16 rounding of x: NMSE ~ 2^-24/3 ~ 2e-8 relative, worst element a few
1e-4 of the RMS (tests/test_ds4_matmul_reference.py measures it).  The bounds
leave a wide margin over that and stay orders of magnitude below any misread
weight (a wrong row or a bf16 reading of the halves)."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_matmul_ops as mo

W = sibling(__file__, "_ds4_weights")

DISPATCH = {
    "matmul_f16_ordered_chunks_kernel": "n_tok == 1 (no knob) -> reached by shape 'router 4096->256, decode'",
    "cublasGemmEx F16 x F16 -> F32 (x converted by f32_to_f16_kernel)":
        "n_tok > 1 and cuBLAS ready, no DS4_CUDA_SERIAL_F16_MATMUL -> reached by shape 'router 4096->256, 129 tokens (prefill)'",
    "matmul_f16_kernel": "n_tok == 1 with DS4_CUDA_NO_ORDERED_F16_MATMUL -> knob",
    "matmul_f16_serial_kernel": "DS4_CUDA_SERIAL_F16_MATMUL (any n_tok), or DS4_CUDA_SERIAL_ROUTER on the router "
                                "decode shape 4096->256 -> knob",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_ORDERED_F16_MATMUL": "1"}, {"DS4_CUDA_SERIAL_F16_MATMUL": "1"},
                  {"DS4_CUDA_SERIAL_ROUTER": "1"}]


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, in_dim, out_dim = d["n_tok"], d["in_dim"], d["out_dim"]
    m, (off,), _ = W.dense(shape, ctx, rng, [("F16", out_dim, in_dim)])
    if d.get("offset_past_end"):
        off = m.size - out_dim * in_dim  # half the weights lie beyond the map
    W.mirror_if_cancelling(d, m, [off], out_dim, 2 * in_dim)
    x = W.activations(rng, d, (n_tok, in_dim))
    args = {"out": Out("f32", (n_tok, out_dim)), "model_map": m, "model_size": m.size, "weight_offset": off,
            "in_dim": in_dim, "out_dim": out_dim, "x": In(x), "n_tok": n_tok}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": mo.matmul_f16(m.array, off, in_dim, out_dim, x, n_tok)})


def _s(label, n_tok, in_dim, out_dim, tensor=None, **kw):
    return Shape(label, {"n_tok": n_tok, "in_dim": in_dim, "out_dim": out_dim, **kw.pop("dims", {})},
                 source=f"model:{tensor}" if tensor else "synthetic", **kw)


SPEC = UnitSpec(
    unit="ds4_gpu_matmul_f16_tensor",
    reference="reference.ds4_matmul_ops.matmul_f16",
    inputs=W.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=1e-2)},
    shapes=[
        _s("router 4096->256, decode", 1, 4096, 256, "blk.3.ffn_gate_inp.weight", timed=True),
        _s("router 4096->256, 2 tokens", 2, 4096, 256, "blk.3.ffn_gate_inp.weight"),
        # untimed since the 2048-token prefill chunk below times the same weights on the same path
        _s("router 4096->256, 129 tokens (prefill)", 129, 4096, 256, "blk.3.ffn_gate_inp.weight"),
        # prefill at ds4's working batch: ds4.c prefills in chunks of 2048 tokens and projects each chunk's
        # router logits, HC mixers, compressor rows and indexer queries here (metal_graph_encode_layer_*_batch)
        _s("router 4096->256, 2048 tokens (prefill chunk)", 2048, 4096, 256, "blk.3.ffn_gate_inp.weight",
           timed=True),
        _s("hc_ffn_fn 16384->24, 2048 tokens (prefill chunk)", 2048, 16384, 24, "blk.3.hc_ffn_fn.weight",
           timed=True),
        _s("compressor kv (ratio 4) 4096->1024, 2048 tokens (prefill chunk)", 2048, 4096, 1024,
           "blk.2.attn_compressor_kv.weight", timed=True),
        _s("indexer attn_q_b 1024->8192, 2048 tokens (prefill chunk)", 2048, 1024, 8192,
           "blk.2.indexer.attn_q_b.weight", timed=True),
        _s("hc_attn_fn 16384->24, decode", 1, 16384, 24, "blk.3.hc_attn_fn.weight"),
        _s("hc_ffn_fn 16384->24, 128 tokens", 128, 16384, 24, "blk.3.hc_ffn_fn.weight"),
        _s("output_hc_fn 16384->4, decode", 1, 16384, 4, "output_hc_fn.weight"),
        _s("compressor kv (ratio 4) 4096->1024, decode", 1, 4096, 1024, "blk.2.attn_compressor_kv.weight"),
        _s("compressor gate (ratio 128) 4096->512, 127 tokens", 127, 4096, 512, "blk.3.attn_compressor_gate.weight"),
        _s("indexer attn_q_b 1024->8192, decode", 1, 1024, 8192, "blk.2.indexer.attn_q_b.weight"),
        _s("indexer proj 4096->64, 3 tokens", 3, 4096, 64, "blk.2.indexer.proj.weight"),
        _s("odd 4097->5, decode (short last chunk)", 1, 4097, 5),
        _s("odd 33->7, decode (chunks of 2, empty last chunks)", 1, 33, 7),
        _s("odd 1000->131, 3 tokens, x x30", 3, 1000, 131, dims={"x_scale": 30.0}),
        _s("edge: cancelling halves, router 4096->256, decode", 1, 4096, 256, dims={"cancel": True},
           edge=W.CANCEL),
        _s("edge: cancelling halves, router 4096->256, 129 tokens (cuBLAS)", 129, 4096, 256, dims={"cancel": True},
           edge=W.CANCEL),
        _s("edge: cancelling halves, indexer attn_q_b 1024->8192, 2 tokens", 2, 1024, 8192, dims={"cancel": True},
           edge=W.CANCEL),
        # decode only: upstream's prefill path converts x to F16 (65504 at most)
        _s("edge: x x1e5, router 4096->256, decode", 1, 4096, 256, dims={"x_scale": 1e5}, edge=W.HUGE),
        _s("error: weights run past the map", 1, 256, 64, dims={"offset_past_end": True}, expect="error",
           why="a weight range outside the model map is an error"),
    ],
    build=build,
    bytes_moved=lambda s: 2 * s.dims["out_dim"] * s.dims["in_dim"]
    + 4 * s.dims["n_tok"] * (s.dims["in_dim"] + s.dims["out_dim"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
