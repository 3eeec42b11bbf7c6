"""Parity spec: ds4_gpu_router_select_batch_tensor (ds4_gpu_router_select_tensor for
n_tokens tokens of a prompt batch; token ids from `tokens`, used in hash mode).

Token counts 1, 5, 7 and 64: upstream's default kernel routes 4 tokens per block,
so 5 and 7 leave a partial last block.  Hash cases use ds4's real 129280-row
table with the first and last rows among the tokens.  Tie cases as in the
single-token spec.  Tolerance: as ds4_gpu_router_select_tensor."""
import numpy as np

from porter.spec import Call, Exact, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

rc = sibling(__file__, "_router_common")
TIE_RULE = "descending score (probs + bias); equal scores rank the lower expert first (ds4.c topk_desc's strict '>')"

# upstream host function ds4_gpu_router_select_batch_tensor (ds4_cuda.cu): the kernel is chosen by env knobs only
DISPATCH = {
    "router_select_warp_topk_kernel": "neither DS4_CUDA_NO_WARP_ROUTER_SELECT nor DS4_CUDA_NO_PARALLEL_ROUTER_SELECT "
                                      "set (ceil(n_tokens / 4) blocks of 32 x 4) -> reached by shape "
                                      "'5 tokens, biased (partial last block of 4)'",
    "router_select_parallel_kernel": "env DS4_CUDA_NO_WARP_ROUTER_SELECT set, DS4_CUDA_NO_PARALLEL_ROUTER_SELECT "
                                     "unset (n_tokens blocks of 256) -> reached by every shape under KNOWN_GOOD_ENV[0]",
    "router_select_kernel": "env DS4_CUDA_NO_PARALLEL_ROUTER_SELECT set (n_tokens blocks of 1 thread) -> reached by "
                            "every shape under KNOWN_GOOD_ENV[1]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_WARP_ROUTER_SELECT": "1"}, {"DS4_CUDA_NO_PARALLEL_ROUTER_SELECT": "1"}]
TOL = Tol(nmse=1e-11, max_err_rms=1e-5)


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, hash_rows = d["n_tokens"], d.get("hash_rows", 64)
    m, b_off, h_off, b, _ = rc.router_map(rng, hash_rows, d.get("bias_levels", 0))
    lg = rc.separate_near_ties(rc.logits(rng, n_tokens, d.get("levels", 0), d.get("huge", False)), b if d["has_bias"] else None)
    toks = rng.integers(0, hash_rows, n_tokens).astype(np.int32)
    toks[0] = hash_rows - 1
    if n_tokens > 2:
        toks[1], toks[2] = 0, toks[0]  # row 0 and a repeated token
    args = {"selected": Out("i32", (n_tokens, rc.N_USED)), "weights": Out("f32", (n_tokens, rc.N_USED)),
            "probs": Out("f32", (n_tokens, rc.N_EXPERT)), "model_map": m, "model_size": m.size,
            "bias_offset": b_off, "hash_offset": h_off, "hash_rows": hash_rows,
            "n_expert_groups": d.get("n_expert_groups", 0), "n_group_used": 0,
            "has_bias": bool(d["has_bias"]), "hash_mode": bool(d["hash_mode"]),
            "logits": In(lg[: d.get("logit_rows", n_tokens)]), "tokens": In(toks), "n_tokens": n_tokens}
    if shape.expect == "error":
        return Call(args=args)
    sel, w, probs, keys = ref.router_select_batch(m.array, b_off, h_off, hash_rows, args["n_expert_groups"], 0,
                                                  d["has_bias"], d["hash_mode"], lg, toks, n_tokens)
    return Call(args=args, expect={"selected": sel, "weights": w, "probs": probs}, keys={"selected": keys})


def dims(n_tokens, has_bias=True, hash_mode=False, **kw):
    return {"n_tokens": n_tokens, "has_bias": has_bias, "hash_mode": hash_mode, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_router_select_batch_tensor",
    reference="reference.ds4_hc_ops.router_select_batch",
    inputs=rc.INPUTS,
    outputs={"selected": Exact(tie_rule=TIE_RULE), "weights": TOL, "probs": TOL},
    shapes=[
        Shape("1 token, biased", dims(1)),
        Shape("5 tokens, biased (partial last block of 4)", dims(5)),
        Shape("7 tokens, unbiased", dims(7, False)),
        Shape("5 tokens, biased, logits +150 / -110", dims(5, huge=True), edge=rc.EDGE_HUGE),
        Shape("64 tokens, unbiased, logits +150 / -110", dims(64, False, huge=True), edge=rc.EDGE_HUGE),
        Shape("hash routing: 7 tokens, 129280-row table", dims(7, False, True, hash_rows=rc.N_VOCAB)),
        Shape("hash routing, has_bias set (bias ignored): 6 tokens", dims(6, True, True, hash_rows=100)),
        Shape("ties: 6 tokens, logits of 5 values, bias of 3 values", dims(6, levels=5, bias_levels=3)),
        Shape("ties: 3 tokens, logits of 4 values, unbiased", dims(3, False, levels=4)),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 tokens, biased", dims(64)),
        Shape("prefill chunk: 2048 tokens, biased", dims(2048), timed=True),
        Shape("error: expert groups (n_expert_groups 2)", dims(2, n_expert_groups=2), expect="error",
              why="ds4's router has no expert groups"),
        Shape("error: logits hold fewer than n_tokens rows", dims(4, logit_rows=3), expect="error",
              why="logits must hold n_tokens x 256 values"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * s.dims["n_tokens"] * (256 + 256 + 12 + 1) + 4 * 256,
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
