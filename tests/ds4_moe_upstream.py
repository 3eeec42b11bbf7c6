"""ds4's routed-expert specs on a CPU: upstream's float32 mid emulated, and a call's reference made again.

The routed_moe_one and routed_moe_batch tests judge the spec's band (targets/ds4/parity/_ds4_moe_flips.py)
against what upstream's kernels compute; this is that computation, for IQ2_XXS experts, with any number of
tokens: the decode kernels and the expert-tile kernels of a prefill sum alike (one lane per 8th block,
then the quarter-warp tree).
"""

from __future__ import annotations

import numpy as np

from reference import ds4_matmul_ops as mo
from reference import ds4_ops as ops
from reference import quant
from reference.quant import QT


def upstream_mid(call) -> np.ndarray:
    """mid [n_tokens][n_expert][mid_dim] as ds4_cuda.cu computes it in float32 for IQ2_XXS experts: each block
    dot an exact integer sum times 0.125 * f16 d * Q8_K d, summed per lane over every 8th block, the 8 lanes
    reduced by the quarter-warp tree, clamped, then (g / (1 + expf(-g))) * u * w."""
    f32 = np.float32
    a = call.args
    m = a["model_map"].array
    n_tok, n_exp = int(a.get("n_tokens", 1)), int(a["n_expert"])
    in_dim, mid_dim = int(a["expert_in_dim"]), int(a["expert_mid_dim"])
    nb = in_dim // 256
    xq, xd = ops.quantize_q8_K(np.asarray(a["x"].array, dtype=f32).reshape(n_tok, in_dim))
    xv = ops._dequant_activation(xq, xd, 256)
    c = f32(a["clamp"])
    sel = np.asarray(a["selected"].array).reshape(n_tok, n_exp)
    w = np.asarray(a["weights"].array, dtype=f32).reshape(n_tok, n_exp)
    mid = np.zeros((n_tok, n_exp, mid_dim), dtype=f32)
    for e in sorted({int(v) for v in sel.reshape(-1)}):
        tk = np.argwhere(sel == e)
        sums = []
        for off in (a["gate_offset"], a["up_offset"]):
            raw = np.ascontiguousarray(ops._weight_bytes(m, int(off) + e * int(a["gate_expert_bytes"]),
                                                         mid_dim * int(a["gate_row_bytes"])))
            wm = quant.dequantize(raw, QT.IQ2_XXS, (mid_dim, in_dim)).astype(np.float64)
            dw = quant._parse(QT.IQ2_XXS, raw)["d"].astype(np.float64).reshape(mid_dim, nb)
            dots = np.einsum("rbk,pbk->prb", wm.reshape(mid_dim, nb, 256), xv[tk[:, 0]].reshape(-1, nb, 256))
            scale = 0.125 * dw[None] * xd[tk[:, 0]].astype(np.float64)[:, None, :]
            bsum = np.rint(np.divide(dots, scale, out=np.zeros_like(dots), where=scale != 0))
            terms = (f32(0.125) * (dw.astype(f32)[None] * xd[tk[:, 0]][:, None, :]).astype(f32)) * bsum.astype(f32)
            lanes = np.zeros((len(tk), mid_dim, 8), dtype=f32)
            for b in range(nb):
                lanes[:, :, b % 8] += terms[:, :, b]
            v = lanes
            sums.append(((v[..., 0] + v[..., 4]) + (v[..., 2] + v[..., 6]))
                        + ((v[..., 1] + v[..., 5]) + (v[..., 3] + v[..., 7])))
        g, u = sums
        if c > f32(1e-6):
            g, u = np.minimum(g, c), np.clip(u, -c, c)
        mid[tk[:, 0], tk[:, 1]] = ((g / (f32(1) + np.exp(-g))) * u) * w[tk[:, 0], tk[:, 1]][:, None]
    return mid


def code_error_over_band(slot_codes, mid) -> float:
    """The largest |v' - v| / band over the spec's codes, v' the Q8_K code (before rounding) of an emulated
    mid [n_tokens][n_expert][mid_dim], scaled per block of 256 as Q8_K does."""
    worst = 0.0
    for s in slot_codes:
        row = np.asarray(mid[s.token, s.slot], dtype=np.float32).reshape(-1, 256)
        mx = np.take_along_axis(row, np.argmax(np.abs(row), axis=1)[:, None], axis=1)
        v = ((np.float32(-127.0) / mx).astype(np.float32) * row).astype(np.float32).astype(np.float64).reshape(-1)
        live = s.band > 0
        worst = max(worst, float((np.abs(v[live] - s.v[live]) / s.band[live]).max(initial=0.0)))
    return worst


def reference(call) -> tuple[np.ndarray, np.ndarray]:
    """(out [n_tokens][out_dim], mid [n_tokens][n_expert][mid_dim]) of the call's inputs, made from scratch."""
    a = call.args
    return mo.routed_moe(a["model_map"].array, a["gate_offset"], a["up_offset"], a["down_offset"], a["gate_type"],
                         a["down_type"], a["gate_expert_bytes"], a["gate_row_bytes"], a["down_expert_bytes"],
                         a["down_row_bytes"], a["expert_in_dim"], a["expert_mid_dim"], a["out_dim"],
                         a["selected"].array, a["weights"].array, a["n_expert"], a["clamp"], a["x"].array,
                         int(a.get("n_tokens", 1)))


def flip_one(call, mid, s, j) -> np.ndarray:
    """The reference's out [n_tokens][out_dim] with mid code j of slot codes s rounded the other way (one
    code step towards v), as a right float32 kernel may round it."""
    a = call.args
    n_tok, mid_dim, out_dim = int(a.get("n_tokens", 1)), int(a["expert_mid_dim"]), int(a["out_dim"])
    dq = mo.MOE_TYPE_PAIRS[(int(a["gate_type"]), int(a["down_type"]))][1]
    q, d = ops.quantize_q8_K(np.asarray(mid[s.token, s.slot], dtype=np.float32).reshape(1, mid_dim))
    step = 1 if s.v[j] > q[0, j] else -1
    down = mo.expert_matrix(a["model_map"].array, int(a["down_offset"]) + s.expert * int(a["down_expert_bytes"]),
                            int(a["down_row_bytes"]), quant.row_bytes(dq, mid_dim), out_dim, dq, mid_dim)
    out = np.asarray(call.expect["out"], dtype=np.float64).reshape(n_tok, out_dim).copy()
    out[s.token] += float(d[0, j // 256]) * step * down[:, j]
    return out
