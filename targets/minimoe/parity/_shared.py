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
    """build() for the dense projections: out[t][o] = sum_i W[o][i] x[t][i].

    Optional dims (the edge cases of dense_edges; a shape without them draws as it always did):
    call_in_dim / call_out_dim: the sizes the call is given when they differ from the weights the map
    holds (error cases); odd_offset: the weights at an odd byte offset of the map; x_scale: x ~ N(0, 1)
    times it, clipped inside half's range; w_rms: the decoded weights' rms (random_blocks' scale);
    block_scales: (lo, hi) every block's f16 scale(s) drawn log-uniformly from it (block_scales())."""

    def build(shape, ctx, rng):
        d = shape.dims
        n_tok = d["n_tok"]
        if d.get("odd_offset") or d.get("w_rms") is not None or d.get("block_scales") or d.get("in_dim") == 0:
            out_dim, in_dim = d["out_dim"], d["in_dim"]
            raw = edge_blocks(qtype, out_dim, in_dim, rng, d, scale=1.0 if in_dim == 0 else None)
            # lead 161, align 1: an odd offset (GGUF aligns tensor data to 32 bytes; the header sets nothing)
            m, (off,) = (Context.synthetic_map([raw], rng, lead=161, align=1) if d.get("odd_offset")
                         else Context.synthetic_map([raw], rng))
        else:
            m, off, (out_dim, in_dim) = weights(shape, ctx, rng, qtype, d.get("out_dim", 0), d.get("in_dim", 0))
        call_in_dim = d.get("call_in_dim", in_dim)  # error cases lie about in_dim
        call_out_dim = d.get("call_out_dim", out_dim)  # ... or about out_dim
        if d.get("offset_past_end"):
            off = m.size - 64
        x = activations(rng, (n_tok, in_dim), d)
        args = {"out": Out("f32", (n_tok, out_dim)), "model_map": m, "model_size": m.size, "weight_offset": off,
                "in_dim": call_in_dim, "out_dim": call_out_dim, "x": In(x), "n_tok": n_tok}
        if shape.expect == "error":
            return Call(args=args)
        if 0 in (n_tok, out_dim, in_dim):  # an empty output, or the empty sum 0 (gguf decodes no empty matrix)
            return Call(args=args, expect={"out": np.zeros((n_tok, out_dim), np.float32)})
        return Call(args=args, expect={"out": ref_fn(m.array, off, in_dim, out_dim, x, n_tok)})

    return build


# ---- edges of the dense projections -------------------------------------------------------------------
# Each is a call mini_gpu.h makes valid (or an error it names) that the real sizes never reach.  The
# known-good's own limits named below are its grid's: 65535 blocks in y, 8 tokens a tile, 4 rows a block.
HALF_MAX = 65504.0
HALF_IN_RANGE = 60000.0  # activations of the magnitude edge are clipped here: half holds every one of them
X_BIG = 8192.0           # activations of the magnitude edge: N(0, 1) * X_BIG (outlier-feature scale)
EDGE_ACT = (f"activations at +-{X_BIG:g} scale (clipped inside half's range, so half activations hold them) "
            f"and weights of rms 4: products, partial sums and outputs pass half's {HALF_MAX:g}, so a kernel "
            "that holds any of them in half writes inf")
EDGE_SCALE = (f"block scales near the top of half's range: every stored scale is a finite half, the decoded "
              f"weights (d*q, and Q4_K's mins dmin*m) pass {HALF_MAX:g}, so a kernel that holds a decoded scale, "
              "min or weight in half writes inf")
GRID_TOKENS = 65535 * 8  # the largest batch a 65535-block grid of 8-token tiles holds


def block_scales(raw: np.ndarray, qtype: str, rng, lo: float, hi: float) -> np.ndarray:
    """raw blocks of `qtype` (random_blocks' (rows, row_bytes)) with every f16 block scale (d, and dmin
    where the type has one) drawn log-uniformly from [lo, hi] (finite halves: hi <= 65504)."""
    if not 0 < lo <= hi <= HALF_MAX:
        raise SpecError(f"block scales [{lo}, {hi}] are not finite positive halves")
    # (block bytes, byte offsets of the f16 scales in a block), ggml's layouts
    layout = {"Q8_0": (34, (0,)), "Q4_K": (144, (0, 2)), "Q2_K": (84, (80, 82)), "IQ2_XXS": (66, (0,))}
    if qtype not in layout:
        raise SpecError(f"no block scales in {qtype}")
    bb, where = layout[qtype]
    u8 = np.array(raw, dtype=np.uint8, copy=True)
    blocks = u8.reshape(-1, bb)
    for at in where:
        s = np.exp(rng.uniform(np.log(lo), np.log(hi), blocks.shape[0])).astype("<f2")
        blocks[:, at:at + 2] = s.view(np.uint8).reshape(-1, 2)
    return u8


def wrap_rows(in_dim: int, block_vals: int, block_bytes: int) -> int:
    """An out_dim whose weight byte count out_dim * row_bytes is a multiple of 2^64: it wraps to 0 in
    64-bit arithmetic, so only a checked product refuses it (no map holds 2^64 bytes)."""
    row_bytes = in_dim // block_vals * block_bytes
    return 2**64 // (row_bytes & -row_bytes)


def dense_edges(block_vals: int, block_bytes: int, small: dict, *, grid_in_dim: int | None,
                scales: tuple[float, float] | None) -> list[Shape]:
    """The edge cases every dense projection spec carries (mini_gpu.h: y[t][o] = sum_i W[o][i] x[t][i];
    ops return non-zero on bad arguments).  `small`: an odd {out_dim, in_dim} of the type;
    `grid_in_dim`: the in_dim of the GRID_TOKENS batch (None: not made, the x it needs is too big);
    `scales`: the (lo, hi) of EDGE_SCALE (None: the type has no block scale)."""
    out_dim, in_dim = small["out_dim"], small["in_dim"]
    big = 2**62  # a multiple of every block size; n_tok * big * 4 = 2^64 bytes
    shapes = [
        Shape("no tokens: nothing to do, success", {"n_tok": 0, **small},
              zero_answer="no tokens: an empty output, which any answer matches; the return code is the check"),
        Shape("no output rows: nothing to compute, success", {"n_tok": 3, "out_dim": 0, "in_dim": in_dim},
              zero_answer="no output rows: an empty output, which any answer matches; the return code is the check"),
        Shape("in_dim 0, 3 tokens: an empty sum", {"n_tok": 3, "out_dim": out_dim, "in_dim": 0}, expect="either",
              why="in_dim 0 makes every output an empty sum (0), which mini_gpu.h does not forbid and every "
                  "backend refuses (the CPU and Metal backends, the CUDA known-good): refusing is right, so is "
                  "writing zeros; dividing by in_dim (a crash) or leaving out unwritten is not"),
        # sizes whose byte counts wrap past 2^64, on calls with nothing to compute: the CPU backend and the
        # known-good refuse them, Metal (whose checks multiply unchecked) returns 0; neither reads a byte
        Shape("x would need 2^64 bytes (in_dim 2^62, 1 token), no output rows",
              {"n_tok": 1, "out_dim": 0, "in_dim": in_dim, "call_in_dim": big}, expect="either",
              why="x cannot hold n_tok rows of in_dim floats (2^64 bytes), but no output row asks for them: "
                  "refusing is right (the CPU backend, the CUDA known-good), so is returning 0 with nothing "
                  "done (Metal, whose n_tok*in_dim*4 wraps to 0); reading x or writing out is not"),
        Shape("2^64 bytes of weight rows (out_dim past any map), no tokens",
              {"n_tok": 0, **small, "call_out_dim": wrap_rows(in_dim, block_vals, block_bytes)}, expect="either",
              why="out_dim rows of in_dim weights lie outside any map (their byte count is a multiple of 2^64), "
                  "but no token asks for them: refusing is right (the CPU backend, the CUDA known-good), so is "
                  "returning 0 with nothing done (Metal, whose out_dim*row_bytes wraps to 0)"),
        Shape(f"weights at an odd byte offset, {out_dim}x{in_dim}, 3 tokens",
              {"n_tok": 3, **small, "odd_offset": True}, expect="either",
              why="GGUF aligns tensor data to 32 bytes and Metal binds a buffer at the type's alignment, but "
                  "mini_gpu.h sets no alignment for weight_offset: refusing an odd offset is right, so is "
                  "computing it right (the CPU backend and the CUDA known-good read the bytes)"),
        Shape(f"activations at +-{X_BIG:g}, 9x256, 3 tokens", {"n_tok": 3, "out_dim": 9, "in_dim": 256,
              "x_scale": X_BIG, "w_rms": 4.0}, edge=EDGE_ACT),
    ]
    if scales is not None:
        shapes.append(Shape("block scales near half's top, 9x256, 3 tokens",
                            {"n_tok": 3, "out_dim": 9, "in_dim": 256, "block_scales": scales}, edge=EDGE_SCALE))
    if grid_in_dim is not None:
        shapes.append(Shape(f"{GRID_TOKENS} tokens (65535 x 8, the grid's last tile), 3x{grid_in_dim}",
                            {"n_tok": GRID_TOKENS, "out_dim": 3, "in_dim": grid_in_dim}))
    return shapes


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
    if n_tokens == 0 or top_k == 0:  # an empty call: no slot to fill
        return np.zeros((n_tokens, top_k), np.int32)
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


def edge_blocks(qtype: str, n_rows: int, n_cols: int, rng, dims, scale=None) -> np.ndarray:
    """random_blocks of a matrix (or an expert stack), with the magnitude edges' options of `dims` (w_rms:
    the decoded weights' rms, else `scale`; block_scales: (lo, hi) of every f16 block scale)."""
    raw = quant.random_blocks(qtype, n_rows, n_cols, rng, scale=dims.get("w_rms", scale))
    if dims.get("block_scales"):
        raw = block_scales(raw, qtype, rng, *dims["block_scales"])
    return raw


def routed_edges(base: Shape, weights: str) -> list[Shape]:
    """The routed experts' empty call and weight range (`weights`: which stack's offset runs past the map):
    no tokens succeeds; weights outside the map are refused, with tokens and without (the CPU backend,
    Metal and the known-good all check the range before their empty-call return)."""
    return [
        Shape("no tokens: nothing to do, success", dict(base.dims, n_tokens=0),
              zero_answer="no tokens: an empty output, which any answer matches; the return code is the check"),
        Shape(f"error: {weights} weights past the end of the map", dict(base.dims, offset_past_end=True),
              expect="error", why=f"the {weights} experts' weight range lies outside the model map"),
        Shape(f"error: {weights} weights past the end of the map, no tokens",
              dict(base.dims, n_tokens=0, offset_past_end=True), expect="error",
              why=f"the {weights} experts' weight range lies outside the model map, a bad argument even with no "
                  "token to apply them to (the CPU backend and the known-good check it before their empty-call "
                  "return)"),
    ]


def activations(rng, shape, dims) -> np.ndarray:
    """N(0, 1) float32 activations, times dims["x_scale"] (clipped inside half's range) where given."""
    a = rng.standard_normal(shape).astype(np.float32)
    if dims.get("x_scale") is not None:
        a = np.clip(a * np.float32(dims["x_scale"]), -HALF_IN_RANGE, HALF_IN_RANGE).astype(np.float32)
    return a


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
