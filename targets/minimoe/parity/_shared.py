"""Helpers shared by the minimoe parity specs (loaded with spec.sibling; not a spec)."""
import numpy as np

import dataclasses

from porter.spec import Call, Context, In, InOut, Null, Out, Same, Shape, SpecError
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


# ---- bad tensor arguments ---------------------------------------------------------------------------
# mini_gpu.h: "Return 0 on success, non-zero on failure (bad arguments, device error)".  A NULL tensor,
# a tensor whose data is NULL and a tensor holding fewer bytes than the call reads or writes are bad
# arguments: a port that drops its guards dereferences NULL or writes past the caller's buffer.
CONTRACT = 'mini_gpu.h: ops "return non-zero on failure (bad arguments, ...)"'
BAD_TENSOR = {
    "null": ("error: {p} is NULL", "{p} is a NULL tensor, a bad argument; " + CONTRACT),
    "data_null": ("error: {p}->data is NULL", "{p}'s data pointer is NULL, a bad argument; " + CONTRACT),
    "short": ("error: {p}->bytes one element short",
              "{p} holds one element fewer than the call reads or writes, a bad argument (the op would "
              "overrun the caller's buffer); " + CONTRACT),
}


def with_bad_tensors(build, base: Shape, tensors: tuple[str, ...]):
    """(shapes, build): for EVERY tensor parameter named in `tensors`, three expect="error" shapes made
    from the ok case `base` -- the tensor passed as NULL, its descriptor's data pointer NULL, its
    descriptor claiming one element fewer than its buffer holds -- and a build() that makes them (the
    base case's arguments, one of them replaced) and defers every other shape to `build`.

    The claim is one element short of what the call needs only because every minimoe op spec builds
    each In/Out/InOut to exactly the size the call reads or writes (each known-good's guard checks
    that size: scripted/good/*.md); `base` must not be an empty call (n = 0 returns before the data
    checks) nor pass any of `tensors` as an alias (Same)."""
    if base.expect != "ok":
        raise SpecError(f"bad tensor cases are made from an ok case, not {base.label!r}")
    shapes = [Shape(label.format(p=p), dict(base.dims, bad_tensor=p, bad=kind), source=base.source,
                    expect="error", why=why.format(p=p))
              for p in tensors for kind, (label, why) in BAD_TENSOR.items()]

    def build_with_bad_tensors(shape, ctx, rng):
        p, kind = shape.dims.get("bad_tensor"), shape.dims.get("bad")
        if p is None:
            return build(shape, ctx, rng)
        args = dict(build(base, ctx, rng).args)
        a = args.get(p)
        if not isinstance(a, (In, InOut, Out)):
            raise SpecError(f"shape {shape.label!r}: {p} of the base case {base.label!r} is "
                            f"{type(a).__name__}, not a tensor of its own (In, InOut or Out)")
        if any(isinstance(b, Same) and b.param == p for b in args.values()):
            raise SpecError(f"shape {shape.label!r}: another parameter aliases {p} in {base.label!r}")
        if kind == "null":
            args[p] = Null()
        elif kind == "data_null":
            args[p] = dataclasses.replace(a, data_null=True)
        else:  # one element short: every minimoe tensor is 4-byte float32 or int32
            args[p] = dataclasses.replace(a, claim_bytes=a.nbytes - 4)
        return Call(args=args)

    return shapes, build_with_bad_tensors
