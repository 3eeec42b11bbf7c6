"""Parity spec: ds4_gpu_embed_tokens_hc_tensor (prefill: each token's F16 embedding row
in each of its n_hc streams: out [n_tokens][n_hc][n_embd]).

ds4 embeds prompt chunks (n_embd 4096, n_hc 4) from a [129280][4096] F16 table; the
map holds a [1024][4096] table (see ds4_gpu_embed_token_hc_tensor.py).  Token ids
repeat and include the first and last table rows; all are valid (ds4.c dies on
an id outside the table, so out-of-range ids have no CPU semantics to test).
Bit-exact: F16 -> F32 is exact."""
import numpy as np

from porter.spec import Call, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_embed_tokens_hc_tensor (ds4_cuda.cu): one launch, no branch
DISPATCH = {
    "embed_tokens_hc_kernel": "always (grid over n_tokens * n_hc * n_embd) -> reached by shape "
                              "'prefill: 64 tokens x 4096 x 4'",
}


def build(shape, ctx, rng):
    d = shape.dims
    n_vocab, n_tokens, n_embd, n_hc = d["n_vocab"], d["n_tokens"], d["n_embd"], d["n_hc"]
    t = hc.f16_table(rng, n_vocab, n_embd)
    m, (off,) = hc.weight_map(rng, [t])
    if d.get("past_end"):
        off = hc.past_end(m, t.nbytes)
    toks = rng.integers(0, n_vocab, n_tokens).astype(np.int32)
    toks[0], toks[-1] = n_vocab - 1, 0
    if n_tokens > 3:
        toks[2] = toks[1]  # a repeated token
    given = toks[: d.get("tokens_given", n_tokens)]
    args = {"out_hc": Out("f32", (n_tokens, n_hc, n_embd)), "tokens": In(given), "model_map": m,
            "model_size": m.size, "weight_offset": off, "n_vocab": n_vocab, "n_tokens": n_tokens,
            "n_embd": n_embd, "n_hc": n_hc}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out_hc": ref.embed_tokens_hc(toks, m.array, off, n_vocab, n_tokens, n_embd,
                                                                 n_hc)})


def dims(n_vocab, n_tokens, n_embd, n_hc, **kw):
    return {"n_vocab": n_vocab, "n_tokens": n_tokens, "n_embd": n_embd, "n_hc": n_hc, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_embed_tokens_hc_tensor",
    reference="reference.ds4_hc_ops.embed_tokens_hc",
    inputs="an F16 table of N(0, 0.05^2) values with F16 subnormals every 17th value; token ids uniform over the table",
    outputs={"out_hc": Tol(nmse=0.0, max_err_rms=0.0, max_abs=0.0)},
    shapes=[
        Shape("1 token x 4096 x 4", dims(1024, 1, hc.N_EMBD, hc.N_HC)),
        Shape("7 tokens x 4096 x 4 (first/last rows, a repeat)", dims(1024, 7, hc.N_EMBD, hc.N_HC)),
        Shape("odd: 5 tokens x 37 wide x 3 streams", dims(13, 5, 37, 3)),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens x 4096 x 4", dims(1024, 64, hc.N_EMBD, hc.N_HC)),
        Shape("prefill chunk: 2048 tokens x 4096 x 4", dims(1024, 2048, hc.N_EMBD, hc.N_HC), timed=True),
        Shape("error: table runs past the map", dims(64, 2, 256, hc.N_HC, past_end=True), expect="error",
              why="the [n_vocab][n_embd] F16 table must lie inside the model map"),
        Shape("error: tokens tensor shorter than n_tokens", dims(64, 5, 256, hc.N_HC, tokens_given=4),
              expect="error", why="tokens must hold n_tokens ids"),
    ],
    build=build,
    bytes_moved=lambda s: s.dims["n_tokens"] * (4 + 2 * s.dims["n_embd"] + 4 * s.dims["n_embd"] * s.dims["n_hc"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
