"""Parity spec: ds4_gpu_routed_moe_one_tensor with ds4's routed-expert types
(gate/up IQ2_XXS = GGML type 16, down Q2_K = 10): one token's routed FFN.

    out = sum_k W_down[e_k] Q8_K(silu(min(g, c)) * clip(u, -c, c) * weights[k]),
    g, u = W_gate[e_k] Q8_K(x), W_up[e_k] Q8_K(x),   e_k = selected[k]

Each expert tensor holds ds4's 256 experts; only the selected experts carry
valid random blocks, every other expert is random bytes (its f16 scales are
often inf/NaN), so reading a wrong expert, a wrong expert stride or a wrong
row stride shows as non-finite or wrong values.  The last expert (255) and
expert 0 are always among the selected ones.

Compared outputs: `out` and `mid` (the per-slot SwiGLU input of the down
projection, router weight applied).  `gate`, `up` and `experts` are scratch
for a kernel (ds4's CUDA backend keeps the quantized activations there) and are
only checked for staying inside their bounds.

Sizes: ds4's real experts (4096 -> 2048 -> 4096, 256 of them) need 1.8 GB of
expert tensors per map, too much for a parity input, so the shapes keep ds4's
6 slots and 256 experts with in/mid/out dims of 256..1024 (multiples of 256,
the Q8_K / IQ2_XXS / Q2_K block), which drives the same decode kernels.

Tolerance: the reference quantizes x and mid to Q8_K exactly as ds4.c does, so
a right kernel differs only by float32 accumulation and by the rare mid value
that rounds to the other Q8_K code (one code step of one element: ~2e-3 of the
output RMS at these sizes)."""
import numpy as np

from porter.gates.parity.spec import Call, Context, In, Out, Shape, Tol, UnitSpec
from reference import ds4_ops as ops
from reference import quant

IQ2_XXS, Q2_K = ops.GGML_TYPE["IQ2_XXS"], ops.GGML_TYPE["Q2_K"]


def _experts(rng, qtype, rows, cols, chosen):
    """All 256 experts' bytes of one tensor: random bytes, valid blocks for the chosen experts."""
    rb = quant.row_bytes(qtype, cols)
    per = rows * rb
    raw = rng.integers(0, 256, ops.N_EXPERT * per, dtype=np.uint8)
    for e in chosen:
        raw[e * per:(e + 1) * per] = quant.random_blocks(qtype, rows, cols, rng).reshape(-1)
    return raw, per, rb


def build(shape, ctx, rng):
    d = shape.dims
    n_expert, in_dim, mid_dim, out_dim = d["n_expert"], d["in_dim"], d["mid_dim"], d["out_dim"]
    pick = rng.permutation(np.arange(1, ops.N_EXPERT - 1))[: max(0, n_expert - 2)]
    chosen = np.concatenate([[ops.N_EXPERT - 1], pick, [0]])[:n_expert].astype(np.int32)
    gate_raw, g_per, g_rb = _experts(rng, "IQ2_XXS", mid_dim, in_dim, chosen)
    up_raw, _, _ = _experts(rng, "IQ2_XXS", mid_dim, in_dim, chosen)
    down_raw, d_per, d_rb = _experts(rng, "Q2_K", out_dim, mid_dim, chosen)
    # 8 KiB between tensors: no host page holds bytes of two tensors (ds4's GGUF keeps its
    # expert tensors megabytes apart; a backend may register each weight range's pages)
    m, (g_off, u_off, d_off) = Context.synthetic_map([gate_raw, up_raw, down_raw], rng, gap=8192)
    if d.get("down_past_end"):
        d_off = m.size - d_per * 8  # only 8 of the 256 down experts fit: the call must fail
    weights = rng.uniform(0.05, 0.6, n_expert).astype(np.float32)
    x = (rng.standard_normal(in_dim) * d.get("x_scale", 1.0)).astype(np.float32)
    args = {"out": Out("f32", (out_dim,)), "gate": Out("f32", (n_expert, mid_dim)),
            "up": Out("f32", (n_expert, mid_dim)), "mid": Out("f32", (n_expert, mid_dim)),
            "experts": Out("f32", (n_expert, out_dim)),
            "model_map": m, "model_size": m.size, "gate_offset": g_off, "up_offset": u_off, "down_offset": d_off,
            "gate_type": d.get("gate_type", IQ2_XXS), "down_type": Q2_K,
            "gate_expert_bytes": g_per, "gate_row_bytes": g_rb, "down_expert_bytes": d_per, "down_row_bytes": d_rb,
            "expert_in_dim": in_dim, "expert_mid_dim": mid_dim, "out_dim": out_dim,
            "selected": In(chosen), "weights": In(weights), "n_expert": n_expert, "clamp": d["clamp"], "x": In(x)}
    if shape.expect == "error":
        return Call(args=args)
    out, mid = ops.routed_moe_one(m.array, g_off, u_off, d_off, IQ2_XXS, Q2_K, g_per, g_rb, d_per, d_rb,
                                  in_dim, mid_dim, out_dim, chosen, weights, n_expert, d["clamp"], x)
    return Call(args=args, expect={"out": out, "mid": mid})


def _moved(s):
    d = s.dims
    per_slot = (d["mid_dim"] * 2 * quant.row_bytes("IQ2_XXS", d["in_dim"])
                + d["out_dim"] * quant.row_bytes("Q2_K", d["mid_dim"]))
    return d["n_expert"] * per_slot + 4 * (d["in_dim"] + d["out_dim"])


C = ops.SWIGLU_CLAMP

SPEC = UnitSpec(
    unit="ds4_gpu_routed_moe_one_tensor",
    reference="reference.ds4_ops.routed_moe_one",
    outputs={"out": Tol(nmse=1e-6, max_err_rms=1e-2), "mid": Tol(nmse=1e-8, max_err_rms=1e-3)},
    shapes=[
        Shape("decode: 6 of 256 experts, 512 -> 256 -> 512, clamp 10",
              {"n_expert": 6, "in_dim": 512, "mid_dim": 256, "out_dim": 512, "clamp": C}),
        Shape("6 experts, 256 -> 512 -> 256, x x6 so the clamp bites",
              {"n_expert": 6, "in_dim": 256, "mid_dim": 512, "out_dim": 256, "clamp": C, "x_scale": 6.0}),
        Shape("4 experts (not 6), 256 -> 256 -> 768, clamp 10",
              {"n_expert": 4, "in_dim": 256, "mid_dim": 256, "out_dim": 768, "clamp": C}),
        Shape("3 experts, 1024 -> 256 -> 256, no clamp",
              {"n_expert": 3, "in_dim": 1024, "mid_dim": 256, "out_dim": 256, "clamp": 0.0}),
        Shape("decode: 6 experts, 1024 -> 256 -> 1024 (timing)",
              {"n_expert": 6, "in_dim": 1024, "mid_dim": 256, "out_dim": 1024, "clamp": C}, timed=True),
        Shape("error: gate type Q8_0 (8)",
              {"n_expert": 6, "in_dim": 256, "mid_dim": 256, "out_dim": 256, "clamp": C, "gate_type": 8},
              expect="error", why="only the (IQ2_XXS, Q2_K) and (Q4_K, Q4_K) type pairs exist"),
        Shape("error: down experts run past the map",
              {"n_expert": 6, "in_dim": 256, "mid_dim": 256, "out_dim": 256, "clamp": C, "down_past_end": True},
              expect="error", why="the 256 down experts must lie inside the model map"),
    ],
    build=build,
    bytes_moved=_moved,
)
