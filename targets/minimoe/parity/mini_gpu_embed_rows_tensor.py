"""Parity spec: mini_gpu_embed_rows_tensor (F16 rows of the token table widened to
float32: bit-exact).  Real cases read the fixture's token_embd at its real
offset and always include token 0 and token n_vocab-1; a token id outside
[0, n_vocab) must be an error, not a clamp."""
import numpy as np

from porter.spec import Call, Context, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n = d["n_tokens"]
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        m, off = ctx.fixture_map(), t.offset
        n_vocab, n_embd = t.shape
    else:
        n_vocab, n_embd = d["n_vocab"], d["n_embd"]
        table = rng.standard_normal((n_vocab, n_embd)).astype("<f2")
        m, (off,) = Context.synthetic_map([table], rng)
    tokens = rng.integers(0, n_vocab, n).astype(np.int32)
    if n >= 2:
        tokens[0], tokens[-1] = 0, n_vocab - 1
    if "bad_token" in d:
        tokens[d.get("bad_at", n // 2)] = n_vocab if d["bad_token"] == "n_vocab" else int(d["bad_token"])
    args = {"out": Out("f32", (n, n_embd)), "tokens": In(tokens), "model_map": m, "model_size": m.size,
            "weight_offset": off, "n_vocab": n_vocab, "n_embd": n_embd, "n_tokens": n}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"out": ops.embed_rows(tokens, m.array, off, n_vocab, n_embd, n)})


BASE = Shape("odd table 37x40, 5 tokens", {"n_tokens": 5, "n_vocab": 37, "n_embd": 40})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "tokens"))

SPEC = UnitSpec(
    unit="mini_gpu_embed_rows_tensor",
    reference="reference.minimoe_ops.embed_rows",
    inputs="the fixture's embedding rows; token ids uniform over the vocabulary",
    outputs={"out": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape("token_embd, 1 token", {"n_tokens": 1}, source="fixture:token_embd.weight"),
        Shape("token_embd, 3 tokens", {"n_tokens": 3}, source="fixture:token_embd.weight"),
        Shape("token_embd, 7 tokens", {"n_tokens": 7}, source="fixture:token_embd.weight"),
        BASE,
        # every real row (n_embd 256) fits one block's threads: only a wider row walks a row in strides
        Shape("odd table 37x600, 4 tokens (a row wider than one block)", {"n_tokens": 4, "n_vocab": 37, "n_embd": 600}),
        # the Metal backend returns 0 for no tokens
        Shape("no tokens: nothing to do, success", {"n_tokens": 0}, source="fixture:token_embd.weight",
              zero_answer="no tokens: an empty output, which any answer matches; the return code is the check"),
        Shape("token_embd, 1024 tokens (bandwidth)", {"n_tokens": 1024}, source="fixture:token_embd.weight", timed=True),
        Shape("error: token id = n_vocab", {"n_tokens": 3, "bad_token": "n_vocab"}, source="fixture:token_embd.weight",
              expect="error", why="a token id outside [0, n_vocab) is an error, not a clamp"),
        Shape("error: token id = -1", {"n_tokens": 2, "bad_token": -1}, source="fixture:token_embd.weight",
              expect="error", why="a token id outside [0, n_vocab) is an error, not a clamp"),
        # a bad id at each end of the batch, the last past the first 256 tokens: every token is checked,
        # not only the ones one block's threads start on
        Shape("error: token id = n_vocab at the first position", {"n_tokens": 5, "bad_token": "n_vocab", "bad_at": 0},
              source="fixture:token_embd.weight", expect="error",
              why="a token id outside [0, n_vocab) is an error, not a clamp"),
        Shape("error: token id = -1 at the last of 300 positions", {"n_tokens": 300, "bad_token": -1, "bad_at": -1},
              source="fixture:token_embd.weight", expect="error",
              why="a token id outside [0, n_vocab) is an error, not a clamp"),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: s.dims["n_tokens"] * (4 + 256 * 6),
)
