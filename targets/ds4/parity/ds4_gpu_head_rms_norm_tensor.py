"""Parity spec: ds4_gpu_head_rms_norm_tensor (in place: each head_dim-wide head of
x [n_tok][n_head][head_dim] scaled by 1/sqrt(mean(head^2) + eps), no weight).

ds4 normalises the 64 query heads of 512 after the q projection (eps 1e-6), for one
decode token or a prompt batch.  Heads get scales over two decades (a norm over
the wrong head shows); head_dim 300 and 96 leave tails past 256 threads / float4;
head_dim 2 with eps 0.5 makes eps matter.  Tolerance: as rms_norm_plain."""
from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref
from reference import ds4_ops as ops

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_head_rms_norm_tensor (ds4_cuda.cu): one block per (token, head)
DISPATCH = {
    "head_rms_norm_kernel": "always (n_tok * n_head blocks x 256) -> reached by shape 'decode: 64 heads x 512, 1 token'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, n_head, head_dim, eps = d["n_tok"], d["n_head"], d["head_dim"], d["eps"]
    x = hc.scaled_rows(rng, n_tok * n_head, head_dim, *d.get("scale", (0.1, 10.0)),
                       near_zero=d.get("near_zero", False))
    x = x.reshape(n_tok, n_head, head_dim)
    if shape.expect == "error":
        return Call(args={"x": InOut(x[:, :, :-1].copy()), "n_tok": n_tok, "n_head": n_head, "head_dim": head_dim,
                          "eps": eps})
    return Call(args={"x": InOut(x), "n_tok": n_tok, "n_head": n_head, "head_dim": head_dim, "eps": eps},
                expect={"x": ref.head_rms_norm(x, n_tok, n_head, head_dim, eps)})


def dims(n_tok, n_head=ops.N_HEAD, head_dim=ops.HEAD_DIM, eps=hc.RMS_EPS, **kw):
    return {"n_tok": n_tok, "n_head": n_head, "head_dim": head_dim, "eps": eps, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_head_rms_norm_tensor",
    reference="reference.ds4_hc_ops.head_rms_norm",
    inputs=hc.NORM_INPUTS,
    outputs={"x": Tol(nmse=1e-10, max_err_rms=3e-5)},
    shapes=[
        Shape("decode: 64 heads x 512, 1 token", dims(1)),
        Shape("7 tokens x 64 heads x 512", dims(7)),
        Shape("near zero: 3 tokens x 64 heads x 512", dims(3, near_zero=True), edge=hc.EDGE_NEAR_ZERO),
        Shape("odd: 5 tokens x 3 heads x 96", dims(5, 3, 96)),
        Shape("odd: 2 tokens x 5 heads x 300", dims(2, 5, 300)),
        Shape("eps 0.5 dominates: 3 tokens x 4 heads x 2, small x", dims(3, 4, 2, 0.5, scale=(0.05, 0.3))),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 64 heads x 512", dims(64)),
        Shape("prefill chunk: 2048 tokens x 64 heads x 512", dims(2048), timed=True),
        Shape("error: x holds fewer than n_tok * n_head * head_dim values", dims(2, 3, 64), expect="error",
              why="x must hold every head"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_tok"] * s.dims["n_head"] * s.dims["head_dim"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
