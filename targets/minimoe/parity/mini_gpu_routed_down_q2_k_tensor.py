"""Parity spec: mini_gpu_routed_down_q2_k_tensor on the fixture's real Q2_K down experts
(blk.*.ffn_down_exps, [8][256][256]) and synthetic stacks; the expert weights
are arbitrary positive numbers (not renormalised: a kernel that renormalises
or ignores them fails).  Edges: no tokens (success), the down weights past the end of the map
(an error, with tokens and without), n_embd 262140 (= 65535 x 4: the known-good's last 4-row block of a
65535-block grid), and mid at +-8192 with weights of rms 4 (every activation a finite half; each expert's
weighted row and the output pass 65504 in float32).

Tolerance: NMSE <= 1e-6 as the dense projections (float32 in any order, half activations)."""
import numpy as np

from porter.spec import Call, Context, In, Out, Shape, SpecError, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, top_k = d["n_tokens"], d["top_k"]
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        if t.qtype != "Q2_K":
            raise SpecError(f"{t.name} is {t.qtype}, expected Q2_K")
        n_expert, n_embd, n_ff = t.shape
        m, off = ctx.fixture_map(), t.offset
    else:
        n_expert, n_embd, n_ff = d["n_expert"], d["n_embd"], d["n_ff"]
        raw = sh.edge_blocks("Q2_K", n_expert * n_embd, n_ff, rng, d)
        m, (off,) = Context.synthetic_map([raw], rng)
    if d.get("offset_past_end"):
        off = m.size - 64
    mid = sh.activations(rng, (n_tokens, top_k, n_ff), d)
    ids = sh.expert_ids(rng, n_tokens, n_expert, top_k)
    w = rng.uniform(0.1, 2.0, (n_tokens, top_k)).astype(np.float32)
    if d.get("bad_id"):
        ids[n_tokens // 2, top_k - 1] = n_expert
    args = {"out": Out("f32", (n_tokens, n_embd)), "model_map": m, "model_size": m.size, "down_offset": off,
            "n_ff": n_ff, "n_embd": n_embd, "n_expert": n_expert, "mid": In(mid), "expert_ids": In(ids),
            "expert_weights": In(w), "n_tokens": n_tokens, "top_k": top_k}
    if shape.expect == "error":
        return Call(args=args)
    if n_tokens == 0:
        return Call(args=args, expect={"out": np.zeros((0, n_embd), np.float32)})
    return Call(args=args, expect={"out": ops.routed_down_q2_k(m.array, off, n_ff, n_embd, n_expert, mid, ids, w,
                                                                  n_tokens, top_k)})


BASE = Shape("synthetic: 3 experts of 24x512, top 3, 3 tokens",
             {"n_tokens": 3, "top_k": 3, "n_expert": 3, "n_embd": 24, "n_ff": 512})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "mid", "expert_ids", "expert_weights"))

SPEC = UnitSpec(
    unit="mini_gpu_routed_down_q2_k_tensor",
    reference="reference.minimoe_ops.routed_down_q2_k",
    inputs=sh.INPUTS,
    outputs={"out": Tol(nmse=1e-6, max_err_rms=5e-3)},
    shapes=[
        Shape("real experts, 1 token x top 2", {"n_tokens": 1, "top_k": 2}, source="fixture:blk.0.ffn_down_exps.weight"),
        Shape("real experts, 3 tokens x top 2", {"n_tokens": 3, "top_k": 2}, source="fixture:blk.1.ffn_down_exps.weight"),
        Shape("real experts, 7 tokens x top 2", {"n_tokens": 7, "top_k": 2}, source="fixture:blk.0.ffn_down_exps.weight"),
        BASE,
        Shape("synthetic: 1 expert of 5x256, top 1, 4 tokens",
              {"n_tokens": 4, "top_k": 1, "n_expert": 1, "n_embd": 5, "n_ff": 256}),
        Shape("real experts, 64 tokens x top 2 (timing)", {"n_tokens": 64, "top_k": 2},
              source="fixture:blk.1.ffn_down_exps.weight", timed=True),
        Shape("error: an expert id = n_expert", {"n_tokens": 3, "top_k": 2, "bad_id": True},
              source="fixture:blk.0.ffn_down_exps.weight", expect="error",
              why="an expert id outside [0, n_expert) is an error"),
        *sh.routed_edges(BASE, "down"),
        Shape("synthetic: mid at +-8192, 3 experts of 24x512, top 2, 3 tokens",
              {"n_tokens": 3, "top_k": 2, "n_expert": 3, "n_embd": 24, "n_ff": 512, "x_scale": sh.X_BIG, "w_rms": 4.0},
              edge=sh.EDGE_ACT),
        Shape("synthetic: n_embd 262140 (65535 x 4, the grid's last block), 1 expert, top 1, 1 token",
              {"n_tokens": 1, "top_k": 1, "n_expert": 1, "n_embd": 65535 * 4, "n_ff": 256}),
    ] + BAD,
    build=build_checked,
    # the least bytes: each chosen expert's matrix once (84 B per 256 weights; 8 experts in the
    # fixture), each token's top_k inputs, ids and weights, and its output row
    bytes_moved=lambda s: min(s.dims["n_tokens"] * s.dims["top_k"], s.dims.get("n_expert", 8)) * 256 * 256 // 256 * 84
    + s.dims["n_tokens"] * s.dims["top_k"] * (4 * 256 + 8) + 4 * s.dims["n_tokens"] * 256,
)
