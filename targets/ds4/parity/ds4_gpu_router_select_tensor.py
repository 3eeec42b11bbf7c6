"""Parity spec: ds4_gpu_router_select_tensor (one token's MoE routing:
probs = sqrt(softplus(logits[256])); selected = the token's hash-table row
(hash_mode) or the top 6 of probs + bias (bias only with has_bias, never in hash
mode; equal scores: lower expert first); weights = probs[selected] / max(sum,
2^-14) * 1.5, from the unbiased probs).

Cases: biased top-6 (ds4's layers 3..42), unbiased, hash routing with ds4's real
129280-row table (token = last row, and one inside) and with has_bias set (the
bias must be ignored), and logits taking only a few values so that the tie rule
decides.  Tolerance: float32 softplus/sqrt (a few ulps: NMSE ~1e-13, bound 1e-11) for probs and weights;
selected is exact, a mismatch confined to equal scores is 'tie-rule'.

Upstream picks one of three kernels by env knobs; the spec must pass under each
(KNOWN_GOOD_ENV)."""
from porter.spec import Call, Exact, In, Out, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

rc = sibling(__file__, "_router_common")

TIE_RULE = "descending score (probs + bias); equal scores rank the lower expert first (ds4.c topk_desc's strict '>')"

# upstream host function ds4_gpu_router_select_tensor (ds4_cuda.cu): the kernel is chosen by env knobs only
DISPATCH = {
    "router_select_warp_topk_kernel": "neither DS4_CUDA_NO_WARP_ROUTER_SELECT nor DS4_CUDA_NO_PARALLEL_ROUTER_SELECT "
                                      "set (1 block of 32 x 4, one warp per token) -> reached by shape "
                                      "'decode: biased top 6 of 256'",
    "router_select_parallel_kernel": "env DS4_CUDA_NO_WARP_ROUTER_SELECT set, DS4_CUDA_NO_PARALLEL_ROUTER_SELECT "
                                     "unset -> reached by every shape under KNOWN_GOOD_ENV[0]",
    "router_select_kernel": "env DS4_CUDA_NO_PARALLEL_ROUTER_SELECT set (one thread) -> reached by every shape "
                            "under KNOWN_GOOD_ENV[1]",
}
KNOWN_GOOD_ENV = [{"DS4_CUDA_NO_WARP_ROUTER_SELECT": "1"}, {"DS4_CUDA_NO_PARALLEL_ROUTER_SELECT": "1"}]
TOL = Tol(nmse=1e-11, max_err_rms=1e-5)


def build(shape, ctx, rng):
    d = shape.dims
    hash_rows = d.get("hash_rows", 64)
    m, b_off, h_off, b, _ = rc.router_map(rng, hash_rows, d.get("bias_levels", 0))
    if d.get("past_end") == "bias":
        b_off = m.size - 512
    elif d.get("past_end") == "hash":
        h_off = m.size - hash_rows * 12
    lg = rc.separate_near_ties(rc.logits(rng, 1, d.get("levels", 0), d.get("huge", False)), b if d["has_bias"] else None)[0]
    token = {"last": hash_rows - 1}.get(d.get("token", 5), d.get("token", 5))
    args = {"selected": Out("i32", (rc.N_USED,)), "weights": Out("f32", (rc.N_USED,)),
            "probs": Out("f32", (rc.N_EXPERT,)), "model_map": m, "model_size": m.size, "bias_offset": b_off,
            "hash_offset": h_off, "hash_rows": hash_rows, "token": token,
            "n_expert_groups": d.get("n_expert_groups", 0), "n_group_used": d.get("n_group_used", 0),
            "has_bias": bool(d["has_bias"]), "hash_mode": bool(d["hash_mode"]), "logits": In(lg)}
    if shape.expect == "error":
        return Call(args=args)
    sel, w, probs, keys = ref.router_select(m.array, b_off, h_off, hash_rows, token, args["n_expert_groups"],
                                            args["n_group_used"], d["has_bias"], d["hash_mode"], lg)
    return Call(args=args, expect={"selected": sel, "weights": w, "probs": probs}, keys={"selected": keys})


def dims(has_bias, hash_mode, **kw):
    return {"has_bias": has_bias, "hash_mode": hash_mode, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_router_select_tensor",
    reference="reference.ds4_hc_ops.router_select",
    inputs=rc.INPUTS,
    outputs={"selected": Exact(tie_rule=TIE_RULE), "weights": TOL, "probs": TOL},
    shapes=[
        Shape("decode: biased top 6 of 256", dims(True, False), timed=True),
        Shape("unbiased top 6 of 256", dims(False, False)),
        Shape("hash routing: 129280-row table, last token", dims(False, True, hash_rows=rc.N_VOCAB, token="last")),
        Shape("hash routing, has_bias set (bias ignored), token 17", dims(True, True, hash_rows=100, token=17)),
        Shape("ties: logits of 6 values, unbiased", dims(False, False, levels=6)),
        Shape("biased top 6, logits +150 / -110", dims(True, False, huge=True), edge=rc.EDGE_HUGE),
        Shape("unbiased top 6, logits +150 / -110", dims(False, False, huge=True), edge=rc.EDGE_HUGE),
        Shape("ties: logits of 5 values, bias of 3 values", dims(True, False, levels=5, bias_levels=3)),
        Shape("error: expert groups (n_expert_groups 2)", dims(True, False, n_expert_groups=2), expect="error",
              why="ds4's router has no expert groups"),
        Shape("error: n_group_used 1", dims(True, False, n_group_used=1), expect="error",
              why="ds4's router has no expert groups"),
        Shape("error: bias runs past the map", dims(True, False, past_end="bias"), expect="error",
              why="the [256] bias must lie inside the model map"),
        Shape("error: hash table runs past the map", dims(False, True, past_end="hash"), expect="error",
              why="the [hash_rows][6] table must lie inside the model map"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * (256 + 256 + 256 + 12),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
