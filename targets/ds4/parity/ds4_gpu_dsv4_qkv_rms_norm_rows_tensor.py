"""Parity spec: ds4_gpu_dsv4_qkv_rms_norm_rows_tensor (two weighted RMS norms in one
call: q_out = rms_norm(q rows of q_n) * q_w and kv_out = rms_norm(kv rows of kv_n) * kv_w).

ds4 normalises the q LoRA (q_n 1024, attn_q_a_norm) and the kv projection (kv_n
512, attn_kv_a_norm) of one decode token or a prompt batch, eps 1e-6.  The two
weights differ (a kernel that uses q's weight for kv, or one weight for both,
is off); rows get scales over two decades; odd sizes (100 / 37) leave tails;
one case has eps 0.5 with small inputs.  Tolerance: as rms_norm_plain.

Upstream has an env knob that replaces the fused kernel by two launches of the
plain weighted norm; the spec must pass under it too (KNOWN_GOOD_ENV)."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_dsv4_qkv_rms_norm_rows_tensor (ds4_cuda.cu)
DISPATCH = {
    "dsv4_qkv_rms_norm_rows_kernel": "DS4_CUDA_DISABLE_QKV_RMS_FUSED unset (grid rows x 2: y=0 q, y=1 kv) -> "
                                     "reached by shape 'decode: q 1024 + kv 512, 1 token'",
    "rms_norm_weight_kernel": "env DS4_CUDA_DISABLE_QKV_RMS_FUSED set (two ds4_gpu_rms_norm_weight_rows_tensor "
                              "calls) -> reached by every shape under KNOWN_GOOD_ENV[0]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_DISABLE_QKV_RMS_FUSED": "1"}]
TOL = Tol(nmse=1e-10, max_err_rms=3e-5)


def build(shape, ctx, rng):
    d = shape.dims
    q_n, kv_n, rows, eps = d["q_n"], d["kv_n"], d["rows"], d["eps"]
    q_w, kv_w = hc.norm_weight(rng, q_n), hc.norm_weight(rng, kv_n)
    m, (q_off, kv_off) = hc.weight_map(rng, [q_w, kv_w])
    if d.get("past_end"):
        kv_off = hc.past_end(m, kv_w.nbytes)
    lo_hi = d.get("scale", (0.1, 10.0))
    nz = d.get("near_zero", False)
    q, kv = hc.scaled_rows(rng, rows, q_n, *lo_hi, near_zero=nz), hc.scaled_rows(rng, rows, kv_n, *lo_hi, near_zero=nz)
    args = {"q_out": Out("f32", (rows, q_n)), "q": In(q), "model_map": m, "model_size": m.size,
            "q_weight_offset": q_off, "q_n": q_n, "kv_out": Out("f32", (rows, kv_n)), "kv": In(kv),
            "kv_weight_offset": kv_off, "kv_n": kv_n, "rows": rows, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    q_ref, kv_ref = ref.dsv4_qkv_rms_norm_rows(q, m.array, q_off, q_n, kv, kv_off, kv_n, rows, eps)
    return Call(args=args, expect={"q_out": q_ref, "kv_out": kv_ref})


def dims(rows, q_n=hc.N_LORA_Q, kv_n=512, eps=hc.RMS_EPS, **kw):
    return {"rows": rows, "q_n": q_n, "kv_n": kv_n, "eps": eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_dsv4_qkv_rms_norm_rows_tensor",
    reference="reference.ds4_hc_ops.dsv4_qkv_rms_norm_rows",
    inputs=hc.NORM_INPUTS,
    outputs={"q_out": TOL, "kv_out": TOL},
    shapes=[
        Shape("decode: q 1024 + kv 512, 1 token", dims(1)),
        Shape("7 tokens, q 1024 + kv 512", dims(7)),
        Shape("near zero: 5 tokens, q 1024 + kv 512", dims(5, near_zero=True), edge=hc.EDGE_NEAR_ZERO),
        Shape("odd: 3 rows, q 100 + kv 37", dims(3, 100, 37)),
        Shape("eps 0.5 dominates: 2 rows, q 3 + kv 2, small x", dims(2, 3, 2, 0.5, scale=(0.05, 0.3))),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens, q 1024 + kv 512", dims(64)),
        Shape("prefill chunk: 2048 tokens, q 1024 + kv 512", dims(2048), timed=True),
        Shape("error: kv weight runs past the map", dims(1, 256, 128, past_end=True), expect="error",
              why="both norm weights must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["rows"] * (s.dims["q_n"] + s.dims["kv_n"]) + 4 * (s.dims["q_n"] + s.dims["kv_n"]),
)
