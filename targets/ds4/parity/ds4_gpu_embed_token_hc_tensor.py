"""Parity spec: ds4_gpu_embed_token_hc_tensor (one token's F16 embedding row, widened
to float32 and copied into each of the n_hc hyper-connection streams: out [n_hc][n_embd]).

ds4 embeds with n_embd 4096 and n_hc 4 from a [129280][4096] F16 table.  The full
table is 1 GB, so the map holds a [1024][4096] table (the row stride, the F16
decode and the 4-stream copy are what a kernel can get wrong; the vocabulary
size only moves the offset).  Rows hold F16 subnormals too (a decode that
flushes them is off), and the token is the table's last row or row 0 as well as
one inside.  F16 -> F32 is exact, so the comparison is bit-exact."""
from porter.spec import Call, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_embed_token_hc_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "embed_token_hc_kernel": "always (grid over n_embd * n_hc) -> reached by shape 'decode: 4096 x 4 streams, token inside'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_vocab, n_embd, n_hc = d["n_vocab"], d["n_embd"], d["n_hc"]
    table = hc.f16_table(rng, n_vocab, n_embd)
    m, (off,) = hc.weight_map(rng, [table])
    if d.get("past_end"):
        off = hc.past_end(m, table.nbytes)
    token = {"last": n_vocab - 1, "first": 0}.get(d["token"], d["token"])
    args = {"out_hc": Out("f32", (n_hc, n_embd)), "model_map": m, "model_size": m.size, "weight_offset": off,
            "n_vocab": n_vocab, "token": token, "n_embd": n_embd, "n_hc": n_hc}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out_hc": ref.embed_token_hc(m.array, off, n_vocab, token, n_embd, n_hc)})


def dims(n_vocab, n_embd, n_hc, token, **kw):
    return {"n_vocab": n_vocab, "n_embd": n_embd, "n_hc": n_hc, "token": token, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_embed_token_hc_tensor",
    reference="reference.ds4_hc_ops.embed_token_hc",
    inputs="an F16 table of N(0, 0.05^2) values with F16 subnormals every 17th value",
    outputs={"out_hc": Tol(nmse=0.0, max_err_rms=0.0, max_abs=0.0)},
    shapes=[
        Shape("decode: 4096 x 4 streams, token inside", dims(1024, hc.N_EMBD, hc.N_HC, 777), timed=True),
        Shape("4096 x 4, last table row", dims(1024, hc.N_EMBD, hc.N_HC, "last")),
        Shape("4096 x 4, row 0", dims(1024, hc.N_EMBD, hc.N_HC, "first")),
        Shape("odd: 37 wide x 3 streams, 11-row table, last row", dims(11, 37, 3, "last")),
        Shape("4097 wide (tail past 16 x 256) x 4, token 2", dims(5, 4097, hc.N_HC, 2)),
        Shape("error: table runs past the map", dims(64, 256, hc.N_HC, 3, past_end=True), expect="error",
              why="the [n_vocab][n_embd] F16 table must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 2 * s.dims["n_embd"] + 4 * s.dims["n_embd"] * s.dims["n_hc"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
