"""Parity spec: mini_gpu_routed_gate_up_iq2_xxs_tensor on the fixture's real IQ2_XXS
expert tensors (blk.*.ffn_gate_exps / ffn_up_exps, [8][256][256]) at their real
offsets -- the type the failed port never decoded -- and on synthetic expert
stacks of other sizes.  Every token's experts are distinct and the first and
last expert are always used (a wrong expert stride shows on expert 7).  Edges: no tokens (success),
the weights past the end of the map (an error, with tokens and without), x at +-8192 with weights of rms 4,
and block scales d in [20000, 60000] (finite halves whose group scales d*(0.5+k)/4 and decoded weights pass
65504 in float32).

Tolerance: NMSE <= 1e-6 as the dense projections (float32 in any order, half activations): both edges keep
every activation a finite half."""
import numpy as np

from porter.spec import Call, Context, In, Out, Shape, SpecError, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, top_k = d["n_tokens"], d["top_k"]
    if shape.fixture_tensors:
        tg, tu = (ctx.tensor(n) for n in shape.fixture_tensors)
        if tg.qtype != "IQ2_XXS" or tu.qtype != "IQ2_XXS" or tg.shape != tu.shape:
            raise SpecError("gate/up experts are not two IQ2_XXS tensors of one shape")
        n_expert, n_ff, n_embd = tg.shape
        m, g_off, u_off = ctx.fixture_map(), tg.offset, tu.offset
    else:
        n_expert, n_ff, n_embd = d["n_expert"], d["n_ff"], d["n_embd"]
        g = sh.edge_blocks("IQ2_XXS", n_expert * n_ff, n_embd, rng, d)
        u = sh.edge_blocks("IQ2_XXS", n_expert * n_ff, n_embd, rng, d)
        m, (g_off, u_off) = Context.synthetic_map([g, u], rng)
    if d.get("offset_past_end"):
        u_off = m.size - 64
    x = sh.activations(rng, (n_tokens, n_embd), d)
    ids = sh.expert_ids(rng, n_tokens, n_expert, top_k)
    if d.get("bad_id") is not None:
        ids[n_tokens // 2, top_k - 1] = n_expert if d["bad_id"] == "n_expert" else int(d["bad_id"])
    args = {"gate": Out("f32", (n_tokens, top_k, n_ff)), "up": Out("f32", (n_tokens, top_k, n_ff)),
            "model_map": m, "model_size": m.size, "gate_offset": g_off, "up_offset": u_off, "n_embd": n_embd,
            "n_ff": n_ff, "n_expert": n_expert, "x": In(x), "expert_ids": In(ids), "n_tokens": n_tokens,
            "top_k": top_k}
    if shape.expect == "error":
        return Call(args=args)
    if n_tokens == 0:
        return Call(args=args, expect={"gate": np.zeros((0, top_k, n_ff), np.float32),
                                       "up": np.zeros((0, top_k, n_ff), np.float32)})
    gate, up = ops.routed_gate_up_iq2_xxs(m.array, g_off, u_off, n_embd, n_ff, n_expert, x, ids, n_tokens, top_k)
    return Call(args=args, expect={"gate": gate, "up": up})


REAL = "fixture:blk.0.ffn_gate_exps.weight,blk.0.ffn_up_exps.weight"
REAL1 = "fixture:blk.1.ffn_gate_exps.weight,blk.1.ffn_up_exps.weight"

BASE = Shape("synthetic: 3 experts of 24x512, top 3, 3 tokens",
             {"n_tokens": 3, "top_k": 3, "n_expert": 3, "n_ff": 24, "n_embd": 512})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("gate", "up", "x", "expert_ids"))

SPEC = UnitSpec(
    unit="mini_gpu_routed_gate_up_iq2_xxs_tensor",
    reference="reference.minimoe_ops.routed_gate_up_iq2_xxs",
    inputs=sh.INPUTS,
    outputs={"gate": Tol(nmse=1e-6, max_err_rms=5e-3), "up": Tol(nmse=1e-6, max_err_rms=5e-3)},
    shapes=[
        Shape("real experts, 1 token x top 2", {"n_tokens": 1, "top_k": 2}, source=REAL),
        Shape("real experts, 3 tokens x top 2", {"n_tokens": 3, "top_k": 2}, source=REAL1),
        Shape("real experts, 7 tokens x top 2", {"n_tokens": 7, "top_k": 2}, source=REAL),
        BASE,
        Shape("synthetic: 1 expert of 1x256, top 1, 5 tokens",
              {"n_tokens": 5, "top_k": 1, "n_expert": 1, "n_ff": 1, "n_embd": 256}),
        Shape("real experts, 64 tokens x top 2 (timing)", {"n_tokens": 64, "top_k": 2}, source=REAL1, timed=True),
        Shape("error: an expert id = n_expert", {"n_tokens": 3, "top_k": 2, "bad_id": "n_expert"}, source=REAL,
              expect="error", why="an expert id outside [0, n_expert) is an error"),
        Shape("error: a negative expert id", {"n_tokens": 2, "top_k": 2, "bad_id": -1}, source=REAL,
              expect="error", why="an expert id outside [0, n_expert) is an error"),
        *sh.routed_edges(BASE, "up"),
        Shape("synthetic: x at +-8192, 3 experts of 24x512, top 2, 3 tokens",
              {"n_tokens": 3, "top_k": 2, "n_expert": 3, "n_ff": 24, "n_embd": 512, "x_scale": sh.X_BIG, "w_rms": 4.0},
              edge=sh.EDGE_ACT),
        Shape("synthetic: block scales near half's top, 3 experts of 24x512, top 2, 3 tokens",
              {"n_tokens": 3, "top_k": 2, "n_expert": 3, "n_ff": 24, "n_embd": 512, "block_scales": (20000.0, 60000.0)},
              edge=sh.EDGE_SCALE),
    ] + BAD,
    build=build_checked,
    # the least bytes: each expert that is chosen at all has its gate and up matrices read once
    # (66 B per 256 weights; the fixture has 8 experts), whatever the number of tokens choosing it:
    # counting them per token would let an honest kernel look faster than the memory allows
    bytes_moved=lambda s: min(s.dims["n_tokens"] * s.dims["top_k"], s.dims.get("n_expert", 8)) * 2 * 256 * 256 // 256 * 66
    + 4 * s.dims["n_tokens"] * (256 + 2 * s.dims["top_k"] * 256),
)
