"""Shared builder of the routed-expert specs (routed_moe_one, routed_moe_batch).

Expert tensors hold ds4's 256 experts ([256][rows][cols]).  Only the experts a
case selects hold valid blocks (porter.spec.weights): in a small map
every other expert is random bytes (its f16 scales often inf/NaN), in a large
one (ds4's real 4096 -> 2048 -> 4096 experts: 1.8 GB) it is a hole of zeros in
a sparse file; either way a kernel that reads a wrong expert, expert stride or
row stride gets wrong values.

Selection: every token picks n_expert distinct experts from a pool with
Zipf-like frequencies, so some experts serve many tokens (several expert tiles,
one of them partial) and others one token; expert 255 (the last) is in the
first token's set and expert 0 in the last token's.  Real-size cases draw from
10 experts (their reference dequantizes each selected expert), small ones from
all 256, unless the case names its pool (dims "pool": a prefill chunk's routing
on a few experts)."""
import numpy as np

from porter.spec import Call, Flag, In, Map, Out, SpecError
from porter.spec.weights import Want, place
from reference import ds4_matmul_ops as mo
from reference import ds4_ops as ops

N = ops.N_EXPERT
GATE_TYPES = ("IQ2_XXS", "Q4_K")
DOWN_TYPES = ("Q2_K", "Q4_K")
PAIR = {"IQ2_XXS": "Q2_K", "Q4_K": "Q4_K"}


def select(rng, n_tokens, n_expert, pool_size):
    pool = np.concatenate([[N - 1], rng.permutation(np.arange(1, N - 1))[: max(0, pool_size - 2)], [0]])
    p = 1.0 / (1.0 + np.arange(pool.size))
    p /= p.sum()
    sel = np.empty((n_tokens, n_expert), dtype=np.int32)
    for t in range(n_tokens):
        row = list(rng.choice(pool, n_expert, replace=False, p=p))
        for need in ([N - 1] if t == 0 else []) + ([0] if t == n_tokens - 1 else []):
            if need not in row:
                spare = [i for i, e in enumerate(row) if e not in (N - 1, 0)]
                row[spare[-1] if spare else -1] = need
        sel[t] = rng.permutation(np.asarray(row, dtype=np.int32))
    return sel


def build(shape, ctx, rng, batch: bool):
    return draw(shape, ctx, rng, batch)[0]


def draw(shape, ctx, rng, batch: bool):
    """(call, mid): mid is the reference's float32 SwiGLU output [n_tokens][n_expert][mid_dim] (None for an
    error case), which _ds4_moe_flips judges the call's Q8_K codes by (the batch spec does not compare it)."""
    d = shape.dims
    n_tok = d.get("n_tokens", 1)
    n_expert, in_dim, mid_dim, out_dim = d["n_expert"], d["in_dim"], d["mid_dim"], d["out_dim"]
    gq = d.get("gate", "IQ2_XXS")
    dq = PAIR[gq]
    real = in_dim * mid_dim > (1 << 20)
    sel = select(rng, n_tok, n_expert, d.get("pool", 10 if real else N))
    experts = tuple(sorted(set(int(e) for e in sel.reshape(-1))))
    gate_types = (gq,) if gq == "Q4_K" else GATE_TYPES
    wants = [Want(gq, (N, mid_dim, in_dim), experts, types=gate_types),
             Want(gq, (N, mid_dim, in_dim), experts, types=gate_types),
             Want(dq, (N, out_dim, mid_dim), experts, types=(dq,) if dq == "Q4_K" else DOWN_TYPES)]
    if shape.model_tensors:
        m, placed = ctx.weights(shape, wants, rng)
    else:  # small widths: an in-memory map, no tensor names
        data, _, placed = place(wants, ["gate", "up", "down"], rng)
        m = Map(data)
    g, u, dn = placed
    if g.qtype != u.qtype or PAIR.get(g.qtype) != dn.qtype:
        raise SpecError(f"shape {shape.label!r}: the model's expert types ({g.qtype}, {u.qtype}, {dn.qtype}) "
                        "are not a pair ds4 runs")
    gate_type = d.get("gate_type", ops.GGML_TYPE[g.qtype])
    down_type = ops.GGML_TYPE[dn.qtype]
    d_off = dn.offset
    if d.get("down_past_end"):
        d_off = m.size - dn.expert_bytes * 8  # only 8 of the 256 down experts fit
    weights = rng.uniform(0.05, 0.6, (n_tok, n_expert)).astype(np.float32)
    x = (rng.standard_normal((n_tok, in_dim)) * d.get("x_scale", 1.0)).astype(np.float32)
    pairs = n_tok * n_expert
    args = {"out": Out("f32", (n_tok, out_dim) if batch else (out_dim,)),
            "gate": Out("f32", (pairs, mid_dim)), "up": Out("f32", (pairs, mid_dim)),
            "mid": Out("f32", (pairs, mid_dim)), "experts": Out("f32", (pairs, out_dim)),
            "model_map": m, "model_size": m.size, "gate_offset": g.offset, "up_offset": u.offset,
            "down_offset": d_off, "gate_type": gate_type, "down_type": down_type,
            "gate_expert_bytes": g.expert_bytes, "gate_row_bytes": g.row_bytes,
            "down_expert_bytes": dn.expert_bytes, "down_row_bytes": dn.row_bytes,
            "expert_in_dim": in_dim, "expert_mid_dim": mid_dim, "out_dim": out_dim,
            "selected": In(sel if batch else sel[0]), "weights": In(weights if batch else weights[0]),
            "n_expert": n_expert, "clamp": d["clamp"], "x": In(x if batch else x[0])}
    if batch:
        args["n_tokens"] = n_tok
        args["mid_is_f16"] = Flag()
    if shape.expect == "error":
        return Call(args=args), None
    out, mid = mo.routed_moe(m.array, g.offset, u.offset, d_off, gate_type, down_type, g.expert_bytes,
                             g.row_bytes, dn.expert_bytes, dn.row_bytes, in_dim, mid_dim, out_dim, sel, weights,
                             n_expert, d["clamp"], x, n_tok)
    if batch:
        return Call(args=args, expect={"out": out}), mid
    return Call(args=args, expect={"out": out[0], "mid": mid[0]}), mid


def redraw_x(shape, rng, call, mid, tokens):
    """(call, mid) with the x rows of `tokens` drawn again as draw() draws them and the reference's rows of
    those tokens computed again; the selection, the router weights, the experts and every other row stay
    (the reference's rows are independent: each token sums its own slots in expert order)."""
    a = call.args
    n_tok, in_dim, out_dim = int(a.get("n_tokens", 1)), int(a["expert_in_dim"]), int(a["out_dim"])
    t = np.asarray(sorted(tokens), dtype=np.int64)
    x = np.array(a["x"].array, dtype=np.float32).reshape(n_tok, in_dim)
    x[t] = (rng.standard_normal((t.size, in_dim)) * shape.dims.get("x_scale", 1.0)).astype(np.float32)
    sel = np.asarray(a["selected"].array).reshape(n_tok, -1)[t]
    weights = np.asarray(a["weights"].array, dtype=np.float32).reshape(n_tok, -1)[t]
    m = a["model_map"].array
    out_t, mid_t = mo.routed_moe(m, a["gate_offset"], a["up_offset"], a["down_offset"], a["gate_type"],
                                 a["down_type"], a["gate_expert_bytes"], a["gate_row_bytes"], a["down_expert_bytes"],
                                 a["down_row_bytes"], in_dim, a["expert_mid_dim"], out_dim, sel, weights,
                                 a["n_expert"], a["clamp"], x[t], t.size)
    ref = call.expect["out"]
    out = np.array(ref).reshape(n_tok, out_dim)
    out[t] = out_t
    mid = np.array(mid)
    mid[t] = mid_t
    expect = {"out": out.reshape(ref.shape).astype(ref.dtype)}
    if "mid" in call.expect:
        expect["mid"] = mid[0]
    return Call(args={**a, "x": In(x.reshape(a["x"].array.shape))}, expect=expect), mid


def moved(s):
    """Bytes a call must at least read: the distinct experts' weights (at most n_tokens x n_expert
    of them, at most the 10 a real-size case draws from) and the activations."""
    from reference import quant

    d = s.dims
    n_tok = d.get("n_tokens", 1)
    gq = d.get("gate", "IQ2_XXS")
    per = (2 * d["mid_dim"] * quant.row_bytes(gq, d["in_dim"]) + d["out_dim"] * quant.row_bytes(PAIR[gq], d["mid_dim"]))
    distinct = min(n_tok * d["n_expert"], 10 if d["in_dim"] * d["mid_dim"] > (1 << 20) else N)
    return distinct * per + 4 * n_tok * (d["in_dim"] + d["out_dim"])

INPUTS = ("experts: random valid blocks of the census types (IQ2_XXS or Q4_K gate/up, Q2_K or Q4_K down) for the "
          "selected experts, random bytes or zeros for the rest; x ~ N(0, 1); selections from a Zipf-like pool "
          "with experts 0 and 255 always in; real widths 4096 -> 2048 -> 4096")
