"""Parity spec: ds4_gpu_rms_norm_weight_rows_tensor (per row x / sqrt(mean(x^2) + eps) * w,
w the float32 [n] norm weight in the model map).

ds4 uses it on prompt batches: attn/ffn norms over 4096 per token, the output
norm, the q LoRA norm (1024) and the kv norm (512) of the batched graph, and the
MTP's hnorm over the 4 HC streams of one token (4 rows of 4096).  Rows get scales
over two decades (a norm over the wrong row shows); the weight lies in [0.25, 2]
(ignoring it is far off); odd n (33, 4097) leave tails; n = 2 with eps 0.5 makes
eps matter.  Tolerance: as rms_norm_plain (float32 vs double sum of squares)."""
from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_rms_norm_weight_rows_tensor (ds4_cuda.cu): one block per row
DISPATCH = {
    "rms_norm_weight_kernel": "always (rows blocks x 256 threads) -> reached by shape 'prefill: 64 tokens x 4096'",
}
TOL = Tol(nmse=1e-10, max_err_rms=3e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n, rows, eps = d["n"], d["rows"], d["eps"]
    w = hc.norm_weight(rng, n)
    m, (off,) = hc.weight_map(rng, [w])
    if d.get("past_end"):
        off = hc.past_end(m, w.nbytes)
    x = hc.scaled_rows(rng, rows, n, *d.get("scale", (0.1, 10.0)), near_zero=d.get("near_zero", False))
    args = {"out": Out("f32", (rows, n)), "x": In(x), "model_map": m, "model_size": m.size, "weight_offset": off,
            "n": n, "rows": rows, "eps": eps}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ref.rms_norm_weight_rows(x, m.array, off, n, rows, eps)})


def dims(n, rows, eps=hc.RMS_EPS, **kw):
    return {"n": n, "rows": rows, "eps": eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_rms_norm_weight_rows_tensor",
    reference="reference.ds4_hc_ops.rms_norm_weight_rows",
    inputs=hc.NORM_INPUTS,
    outputs={"out": TOL},
    shapes=[
        Shape("attn norm: 7 tokens x 4096", dims(hc.N_EMBD, 7)),
        Shape("MTP hnorm: 4 HC streams x 4096", dims(hc.N_EMBD, hc.N_HC)),
        Shape("q LoRA norm: 5 tokens x 1024", dims(hc.N_LORA_Q, 5)),
        Shape("kv norm: 3 tokens x 512", dims(512, 3)),
        Shape("1 row x 4096", dims(hc.N_EMBD, 1)),
        Shape("odd: 5 rows x 33", dims(33, 5)),
        Shape("odd: 2 rows x 4097", dims(hc.N_EMBD + 1, 2)),
        Shape("eps 0.5 dominates: 3 rows x 2, small x", dims(2, 3, 0.5, scale=(0.05, 0.3))),
        Shape("near zero: 7 tokens x 4096", dims(hc.N_EMBD, 7, near_zero=True), edge=hc.EDGE_NEAR_ZERO),
        Shape("near zero: q LoRA norm, 5 tokens x 1024", dims(hc.N_LORA_Q, 5, near_zero=True), edge=hc.EDGE_NEAR_ZERO),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 4096", dims(hc.N_EMBD, 64)),
        Shape("prefill chunk: 2048 tokens x 4096", dims(hc.N_EMBD, 2048), timed=True),
        Shape("error: weight runs past the map", dims(256, 2, past_end=True), expect="error",
              why="the [n] norm weight must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n"] * s.dims["rows"] + 4 * s.dims["n"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
