"""Helpers shared by the minimoe parity specs (loaded with spec.sibling; not a spec)."""
import numpy as np

from porter.spec import Call, Context, In, Out, SpecError
from reference import quant


def weights(shape, ctx, rng, qtype: str, rows: int, cols: int, expert_count: int | None = None):
    """(map, offset, rows, cols): the fixture tensor named by the shape, or random valid
    blocks of `qtype` at an offset inside a random map.  For 3-D expert tensors
    `rows` is per expert and `expert_count` experts are stacked."""
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        if t.qtype != qtype:
            raise SpecError(f"{t.name} is {t.qtype}, the spec expects {qtype}")
        return ctx.fixture_map(), t.offset, t.shape
    n = expert_count or 1
    raw = quant.random_blocks(qtype, n * rows, cols, rng)
    m, (off,) = Context.synthetic_map([raw], rng)
    return m, off, ((n, rows, cols) if expert_count else (rows, cols))


def dense_matmul(qtype: str, ref_fn):
    """build() for the dense projections: out[t][o] = sum_i W[o][i] x[t][i]."""

    def build(shape, ctx, rng):
        d = shape.dims
        n_tok = d["n_tok"]
        m, off, wshape = weights(shape, ctx, rng, qtype, d.get("out_dim", 0), d.get("in_dim", 0))
        out_dim, in_dim = wshape
        call_in_dim = d.get("call_in_dim", in_dim)  # error cases lie about in_dim
        if d.get("offset_past_end"):
            off = m.size - 64
        x = rng.standard_normal((n_tok, in_dim)).astype(np.float32)
        args = {"out": Out("f32", (n_tok, out_dim)), "model_map": m, "model_size": m.size, "weight_offset": off,
                "in_dim": call_in_dim, "out_dim": out_dim, "x": In(x), "n_tok": n_tok}
        if shape.expect == "error":
            return Call(args=args)
        return Call(args=args, expect={"out": ref_fn(m.array, off, in_dim, out_dim, x, n_tok)})

    return build


def dense_bytes(qtype: str):
    def moved(shape):
        d = shape.dims
        out_dim, in_dim = d.get("real_shape") or (d["out_dim"], d["in_dim"])
        return quant.tensor_bytes(qtype, (out_dim, in_dim)) + 4 * d["n_tok"] * (in_dim + out_dim)

    return moved


def dense_flops(shape):
    """A multiply and an add per weight per token: the arithmetic no dense matmul can skip."""
    d = shape.dims
    out_dim, in_dim = d.get("real_shape") or (d["out_dim"], d["in_dim"])
    return 2 * out_dim * in_dim * d["n_tok"]


def expert_ids(rng, n_tokens, n_expert, top_k):
    """Distinct experts per token; the last expert sits in the first token's first
    slot and expert 0 in the last token's last slot (a wrong expert stride shows)."""
    ids = np.stack([rng.permutation(n_expert)[:top_k] for _ in range(n_tokens)]).astype(np.int32)

    def put(t, k, e):
        row = ids[t]
        j = np.flatnonzero(row == e)
        if j.size:
            row[j[0]] = row[k]
        row[k] = e

    put(0, 0, n_expert - 1)
    put(n_tokens - 1, top_k - 1, 0)
    return ids


INPUTS = ("weights: the fixture's real tensors, or random valid blocks of the type at random map offsets; "
          "activations ~ N(0, 1); the engine's real widths")
