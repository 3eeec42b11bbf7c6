"""Parity spec: mini_gpu_router_topk_tensor (softmax over n_expert logits, top_k by p
descending, ties to the LOWER expert index; weights renormalised over the chosen).

expert_ids must match exactly.  Real cases take router logits from the fixture
(the F16 router of blk.* applied to random activations by the reference).
Tie cases draw logits from a coarse grid (no near-ties whose order would
depend on float rounding) and force exact ties at the top and across the
top_k boundary; a kernel that breaks ties the other way fails as 'tie-rule'.

Past the engine's 8 experts: 256 experts with each token's top two at both
ends of the range (one among the first 32 experts, one among the last 32: a
kernel that holds experts in slots and mishandles one slot mixes its
probabilities with the others'), and, where mini_gpu.h sets no limit that
some backend does (Metal refuses n_expert > 128 or top_k > 8, the CUDA
known-good n_expert > 256 or top_k > 32), cases left open (expect="either"):
refused, or computed right, never computed wrong -- 300 experts with the top
one past the 256th, top 36 of 40.  A call with no tokens has nothing to do:
the Metal backend returns 0 for it once its tensors hold (mini_metal.m)."""
import numpy as np

from porter.spec import Call, Exact, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

E = sibling(__file__, "_edges")
sh = sibling(__file__, "_shared")

TIE_RULE = "on equal p the lower expert index ranks first"


def _tied_logits(rng, n_tokens, n_expert, top_k):
    lg = rng.integers(-12, 13, (n_tokens, n_expert)).astype(np.float64) / 4.0
    for t in range(n_tokens):
        order = np.argsort(-lg[t], kind="stable")
        if t % 2 == 0 and n_expert >= 2:  # tie at the top
            lg[t, order[1]] = lg[t, order[0]]
        elif top_k < n_expert:  # tie across the boundary: rank top_k-1 and top_k equal
            lg[t, order[top_k]] = lg[t, order[top_k - 1]]
    # the higher index of each tie placed first in memory order would be a different test; shuffle experts
    return lg.astype(np.float32)


def _spread_logits(rng, n_tokens, n_expert):
    """N(0, 2^2) logits; token t's top two at the range's ends: expert n_expert-1-(t % 32) at the row's
    maximum + 1, expert t % 32 at the maximum + 0.5 (continuous values: no ties)."""
    lg = rng.standard_normal((n_tokens, n_expert)) * 2.0
    for t in range(n_tokens):
        top = lg[t].max()
        lg[t, n_expert - 1 - t % 32] = top + 1.0
        lg[t, t % 32] = top + 0.5
    return lg.astype(np.float32)


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_expert, top_k = d["n_tokens"], d.get("n_expert"), d["top_k"]
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        n_expert, n_embd = t.shape
        x = rng.standard_normal((n_tokens, n_embd)).astype(np.float32)
        logits = ops.matmul_f16(ctx.fixture_map().array, t.offset, n_embd, n_expert, x, n_tokens)
    elif d.get("spread"):
        logits = _spread_logits(rng, n_tokens, n_expert)
    else:
        logits = _tied_logits(rng, n_tokens, n_expert, min(top_k, n_expert))
    if d.get("shift"):  # quarter steps stay exact at +1000 (float32 spacing there is 2^-14)
        logits = (logits + np.float32(E.LOGIT_SHIFT)).astype(np.float32)
    # no tokens: the outputs flat and empty (the exact comparison splits a 2-D answer into rows by its first
    # dimension, which an empty batch has none of; flat, it is one empty row: the same nothing)
    out_shape = (n_tokens, top_k) if n_tokens else (0,)
    args = {"expert_ids": Out("i32", out_shape), "expert_weights": Out("f32", out_shape),
            "logits": In(logits), "n_expert": n_expert, "n_tokens": n_tokens, "top_k": top_k}
    if shape.expect == "error":
        return Call(args=args)
    ids, w = ops.router_topk(logits, n_expert, n_tokens, top_k)
    return Call(args=args, expect={"expert_ids": ids.reshape(out_shape), "expert_weights": w.reshape(out_shape)},
                keys={"expert_ids": logits})


BASE = Shape("ties: 5 experts, top 3, 7 tokens", {"n_tokens": 7, "n_expert": 5, "top_k": 3})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("expert_ids", "expert_weights", "logits"))

SPEC = UnitSpec(
    unit="mini_gpu_router_topk_tensor",
    reference="reference.minimoe_ops.router_topk",
    inputs=("logits: the fixture's router weights times x ~ N(0, 1), or quarter steps in -3..3 with ties at the "
            "top and across the top-k boundary; edge: " + E.EDGE_LOGITS),
    outputs={"expert_ids": Exact(tie_rule=TIE_RULE, keys="logits"),
             "expert_weights": Tol(nmse=1e-10, max_err_rms=1e-5)},
    shapes=[
        Shape("real router logits, 1 token", {"n_tokens": 1, "top_k": 2}, source="fixture:blk.0.ffn_gate_inp.weight"),
        Shape("real router logits, 3 tokens", {"n_tokens": 3, "top_k": 2}, source="fixture:blk.1.ffn_gate_inp.weight"),
        Shape("real router logits, 7 tokens", {"n_tokens": 7, "top_k": 2}, source="fixture:blk.0.ffn_gate_inp.weight"),
        Shape("ties: 8 experts, top 2, 16 tokens", {"n_tokens": 16, "n_expert": 8, "top_k": 2}),
        BASE,
        Shape("ties: 8 experts, top 1, 9 tokens", {"n_tokens": 9, "n_expert": 8, "top_k": 1}),
        Shape("ties: 64 experts, top 6, 5 tokens", {"n_tokens": 5, "n_expert": 64, "top_k": 6}),
        Shape("all: 8 experts, top 8, 2 tokens", {"n_tokens": 2, "n_expert": 8, "top_k": 8}),
        Shape("ties: 64 experts, top 6, 5 tokens, logits +1000", {"n_tokens": 5, "n_expert": 64, "top_k": 6,
                                                                  "shift": True}, edge=E.EDGE_LOGITS),
        Shape("real router logits +1000, 7 tokens", {"n_tokens": 7, "top_k": 2, "shift": True},
              source="fixture:blk.0.ffn_gate_inp.weight", edge=E.EDGE_LOGITS),
        Shape("256 experts, top 8, 6 tokens: the top two at the range's ends",
              {"n_tokens": 6, "n_expert": 256, "top_k": 8, "spread": True}, expect="either",
              why="mini_gpu.h sets no n_expert limit: the Metal backend refuses above 128 experts, the CUDA "
                  "known-good computes up to 256; a backend may refuse it, or compute it right"),
        Shape("300 experts, top 4, 5 tokens: the top expert past the 256th",
              {"n_tokens": 5, "n_expert": 300, "top_k": 4, "spread": True}, expect="either",
              why="mini_gpu.h sets no n_expert limit: the Metal backend refuses above 128 experts, the CUDA "
                  "known-good above 256; a backend may refuse it, or compute it right"),
        Shape("top 36 of 40 experts, 3 tokens", {"n_tokens": 3, "n_expert": 40, "top_k": 36, "spread": True},
              expect="either",
              why="mini_gpu.h sets no top_k limit: the Metal backend refuses top_k above 8, the CUDA known-good "
                  "above 32; a backend may refuse it, or compute it right"),
        Shape("no tokens (8 experts, top 2): nothing to do, success", {"n_tokens": 0, "n_expert": 8, "top_k": 2},
              zero_answer="no tokens: empty outputs, which any answer matches; the return code is the check"),
        Shape("real router logits, 512 tokens (timing)", {"n_tokens": 512, "top_k": 2},
              source="fixture:blk.1.ffn_gate_inp.weight", timed=True),
        Shape("error: top_k 9 > n_expert 8", {"n_tokens": 2, "n_expert": 8, "top_k": 9}, expect="error",
              why="top_k must not exceed n_expert"),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: s.dims["n_tokens"] * (4 * 8 + 8 * s.dims["top_k"]),
)
