"""Draws of the routed-expert specs (routed_moe_one, routed_moe_batch) whose Q8_K rounding
of mid no right float32 kernel can take out of `out`'s tolerance.

Why.  `out` is the down projection of Q8_K(mid), a step function of mid.  Q8_K
scales each block of 256 mid values of one (token, slot) by its own value of
largest magnitude m_b: the code of element j is v = iscale_b mid_j,
iscale_b = -127 / m_b.  A code within float32 reach of a rounding boundary
(v = n + 1/2) may round the other way in a right kernel, and each such flip adds
a whole code step d_b W_down[e][:, j] to out[t] (d_b = 1 / iscale_b).  One flip
costs d_b^2 |W_down[e][:, j]|^2 / |out|^2 NMSE, independent of the accumulation
error that caused it; at small widths and few tokens that is the whole 1e-6
bound or more (the numbers are in each spec's docstring).

The construction (draw_unambiguous): every ok call is drawn, the band a right
float32 kernel can move each code by is derived from the call's own arithmetic,
and a draw is kept only when flipping every code inside its band, all at once
and in the worst direction, stays within FLIP_SHARE of each bound of `out` (NMSE
and max|err|/rms over the whole output, as the parity gate measures them);
otherwise the seed's generator draws again: the whole call (routed_moe_one), or
only the x rows of the tokens whose flips break the budget (routed_moe_batch,
draw_unambiguous's `redraw`).  A flip moves only its own token's row of out, so
the budget is the sum over tokens of each token's worst case (NMSE) and the
largest of them (max|err|/rms); at 127 to 130 tokens some token almost always
holds a costly ambiguous code (a whole new call met FLIP_SHARE in 0 of 40 draws
there), while redrawing that token's x settles it in a round or two.

The band, per mid element (g, u: its gate and up sums; U = 2^-24):
  - the sums: a float32 sum of in_dim/256 block dots, each dot an exact integer
    sum times float32 scales (up to three products per term; the min term of
    Q4_K adds as many).  Rounding errors taken as independent, uniform in +-U times
    the value rounded (the standard probabilistic model): the standard deviation
    of g's error is U/sqrt(3) sqrt(sum of the partial sums^2 in block order +
    the terms' own roundings), the sequential order being the largest of the
    usual ones (upstream's decode and expert-tile kernels alike stride over 8
    lanes and reduce a tree); the band takes SIGMAS of them;
  - silu(g) u w in float32: the roundings of the result (exp to 2 + 1.2|g| ulp,
    which covers the fast __expf too, 1 +, /, x u, x w, and the reference's own
    cast), a hard bound (ops_roundings);
  - into the code: 127 / m_b times the error of mid, plus |v| times the
    relative error of m_b (the scale of the whole block) and the roundings of
    -127 / m_b and of iscale x mid.
Not covered: a port that quantizes x by another formula (x / d in place of
x * iscale) moves g by whole x codes, far outside the band."""
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from reference import ds4_matmul_ops as mo
from reference import ds4_ops as ops
from reference import quant

U = 2.0 ** -24  # float32 unit roundoff
SIGMAS = 6.0  # the band holds this many standard deviations of the sums' float32 rounding error
FLIP_SHARE = 0.5  # of each bound of `out`, the most that flipping every ambiguous code may take
MAX_DRAWS = 32  # draws per call before the least ambiguous one is kept (2 in 3 kept on a CPU: 32 fail in ~1e-15)


# silu(g) * u * w after the sums, a hard bound in units of U on the result: exp(-g) to 2 + 1.2|g| ulp (CUDA's
# __expf, which --use_fast_math makes of expf, whose own bound is 2 ulp), then 1 +, / (2 ulp under fast math),
# x u, x w and the reference's own cast to float32
def ops_roundings(g):
    return 2 * (2.0 + 1.2 * np.abs(g)) + 1 + 4 + 1 + 1 + 1


class SlotCodes(NamedTuple):
    """The Q8_K codes of one (token, slot) mid row: v before rounding (float32 as ds4 computes it), the band
    a right kernel's v can be from it, and step, the |d| of each element's block (one code's worth of mid)."""
    token: int
    slot: int
    expert: int
    v: np.ndarray
    band: np.ndarray
    step: np.ndarray

    def near(self) -> np.ndarray:
        """The codes a right kernel may round the other way."""
        a = np.abs(self.v)
        return np.abs(a - np.floor(a) - 0.5) < self.band


def draw_unambiguous(draw, tol, redraw=None):
    """A call whose flip risk fits FLIP_SHARE of tol (out's bounds).  draw() -> (call, mid).  Without redraw:
    the first of up to MAX_DRAWS draws that fits, else the one with the least risk (its note says so).  With
    redraw(call, mid, tokens) -> (call, mid) (the same call with those tokens' inputs drawn again and their
    reference rows computed again): one draw, then up to MAX_DRAWS - 1 rounds of redrawing the tokens that
    break the budget (_tokens_to_redraw)."""
    if redraw is not None:
        return _settle_tokens(draw, tol, redraw)
    best = None
    for n in range(1, MAX_DRAWS + 1):
        call, mid = draw()
        share = _share(*flip_risk(call, mid), tol)
        call.note = f"draw {n}: every ambiguous Q8_K code of mid flipped costs at most {share:.2g} of out's bounds"
        if share <= FLIP_SHARE:
            return call
        if best is None or share < best[0]:
            best = (share, call)
    best[1].note = f"no unambiguous draw in {MAX_DRAWS}; {best[1].note}"
    return best[1]


def _share(nmse, err_rms, tol):
    return max(nmse / tol.nmse, err_rms / tol.max_err_rms)


def _settle_tokens(draw, tol, redraw):
    call, mid = draw()
    flips = token_flips(call, mid)
    redrawn = 0
    for n in range(1, MAX_DRAWS + 1):
        den, rms = _out_scale(call)
        share = _share(*_risk(flips, den, rms), tol)
        call.note = (f"draw 1, {n - 1} rounds ({redrawn} token rows of x drawn again): every ambiguous Q8_K "
                     f"code of mid flipped costs at most {share:.2g} of out's bounds")
        if share <= FLIP_SHARE:
            return call
        if n == MAX_DRAWS:
            break
        again = _tokens_to_redraw(flips, den, rms, tol)
        if not again:  # out is all zeros: nothing to redraw against
            break
        call, mid = redraw(call, mid, again)
        redrawn += len(again)
        for t in again:
            flips.pop(t, None)
        flips.update(token_flips(call, mid, tokens=again))
    call.note = f"no unambiguous draw in {MAX_DRAWS} rounds; {call.note}"
    return call


def _tokens_to_redraw(flips, den, rms, tol) -> list[int]:
    """The tokens whose own worst case breaks max|err|/rms's budget, and, when the NMSE budget is broken, the
    costliest others until what stays takes at most half of it (the redrawn rows bring flips of their own)."""
    again = {t for t, (_, e) in flips.items() if e > FLIP_SHARE * tol.max_err_rms * rms}
    budget = FLIP_SHARE * tol.nmse * den
    total = sum(g for g, _ in flips.values())
    if total > budget:
        total -= sum(flips[t][0] for t in again)
        for g, t in sorted(((g, t) for t, (g, _) in flips.items() if t not in again), reverse=True):
            if total <= budget / 2:
                break
            again.add(t)
            total -= g
    return sorted(again)


def _dims(call):
    a = call.args
    return (int(a.get("n_tokens", 1)), int(a["n_expert"]), int(a["expert_in_dim"]), int(a["expert_mid_dim"]),
            int(a["out_dim"]))


def _parts(m, offset, row_stride, row_bytes, rows, qt, cols):
    """A quantized rows x cols matrix as (scale * q, offset) per element (value = scale * q - offset, float64):
    the two terms a kernel's block dot scales separately (offset: the min term of the K-quants, else 0)."""
    raw = (ops._weight_bytes(m, offset, rows * row_bytes) if row_stride == row_bytes else
           np.concatenate([ops._weight_bytes(m, offset + r * row_stride, row_bytes) for r in range(rows)]))
    q, scale, off, group = quant._decode_int_parts(qt, quant._parse(qt, np.ascontiguousarray(raw)))
    nb, be = q.shape
    sq = (scale[:, :, None] * q.reshape(nb, be // group, group)).reshape(rows, cols)
    return sq, np.broadcast_to(off[:, :, None], (nb, be // group, group)).reshape(rows, cols)


def _block_dots(xv, w):
    """(pairs, rows, blocks): each activation row of xv (pairs x cols) dotted with each row of w per block of
    256, exactly (float64), one matrix product per block."""
    p, cols = xv.shape
    nb = cols // ops.QK_K
    wb = w.reshape(w.shape[0], nb, ops.QK_K).transpose(1, 0, 2)  # blocks, rows, 256
    xb = xv.reshape(p, nb, ops.QK_K).transpose(1, 2, 0)  # blocks, 256, pairs
    return np.matmul(wb, xb).transpose(2, 1, 0)


def _sum_and_sigma(xv, sq, of):
    """Per activation row and weight row: the exact sum (float64) and the standard deviation of a float32
    evaluation's error: the block terms' own roundings (three per product term: upstream's LUT dot multiplies
    three factors, the offset term's three, the difference) and the partial sums of a sequential sum over
    the blocks (the probabilistic model: U/sqrt(3) times the value, per rounding)."""
    t1 = _block_dots(xv, sq)
    t2 = _block_dots(xv, of) if of.any() else np.zeros_like(t1)
    dots = t1 - t2
    partial = np.cumsum(dots, axis=2)[:, :, 1:]
    var = 3 * (t1 ** 2).sum(axis=2) + 3 * (t2 ** 2).sum(axis=2) + (dots ** 2).sum(axis=2) + (partial ** 2).sum(axis=2)
    return dots.sum(axis=2), U / np.sqrt(3.0) * np.sqrt(var)


def code_bands(call, mid, tokens=None) -> list[SlotCodes]:
    """Per (token, slot) with a non-zero mid row, in token then slot order: its codes and their bands (the
    module docstring's derivation).  mid: the reference's float32 mid ([n_tokens][n_expert][mid_dim]);
    tokens: only these tokens' rows (default: all)."""
    a = call.args
    m = a["model_map"].array
    n_tok, n_exp, in_dim, mid_dim, _ = _dims(call)
    gq = mo.MOE_TYPE_PAIRS[(int(a["gate_type"]), int(a["down_type"]))][0]
    c = ops._f32(a["clamp"])
    xq, xd = ops.quantize_q8_K(np.asarray(a["x"].array, dtype=np.float32).reshape(n_tok, in_dim))
    xv = ops._dequant_activation(xq, xd, ops.QK_K)
    mid = np.asarray(mid, dtype=np.float32).reshape(n_tok, n_exp, mid_dim)
    sel = np.maximum(np.asarray(a["selected"].array).reshape(-1)[: n_tok * n_exp].reshape(n_tok, n_exp), 0)
    weights = np.asarray(a["weights"].array, dtype=np.float64).reshape(-1)[: n_tok * n_exp].reshape(n_tok, n_exp)
    g_rb = quant.row_bytes(gq, in_dim)
    nb = mid_dim // ops.QK_K
    out = []
    keep = np.zeros(n_tok, dtype=bool)
    keep[list(range(n_tok)) if tokens is None else list(tokens)] = True
    for e in sorted({int(v) for v in sel[keep].reshape(-1)}):
        tk = np.argwhere((sel == e) & keep[:, None])  # (pairs, 2): token, slot
        base = int(a["gate_expert_bytes"]) * e
        g, sg = _sum_and_sigma(xv[tk[:, 0]], *_parts(m, int(a["gate_offset"]) + base, int(a["gate_row_bytes"]),
                                                      g_rb, mid_dim, gq, in_dim))
        u, su = _sum_and_sigma(xv[tk[:, 0]], *_parts(m, int(a["up_offset"]) + base, int(a["gate_row_bytes"]),
                                                      g_rb, mid_dim, gq, in_dim))
        if c > ops._f32(1e-6):
            g, u = np.minimum(g, c), np.clip(u, -c, c)  # both 1-Lipschitz: the errors do not grow
        with np.errstate(over="ignore"):
            sig = 1.0 / (1.0 + np.exp(-g))
        dsilu = sig * (1.0 + g * (1.0 - sig))  # d silu / dg
        rows = mid[tk[:, 0], tk[:, 1]]  # pairs x mid_dim, float32
        w = np.abs(weights[tk[:, 0], tk[:, 1]])[:, None]
        dmid = (w * SIGMAS * (np.abs(dsilu * u) * sg + np.abs(g * sig) * su)
                + ops_roundings(g) * U * np.abs(rows.astype(np.float64))).reshape(-1, nb, ops.QK_K)
        # Q8_K's scale is per block of 256: the block's value of largest magnitude (the first on ties)
        rb = rows.reshape(-1, nb, ops.QK_K)
        mx = np.take_along_axis(rb, np.argmax(np.abs(rb), axis=2)[:, :, None], axis=2)[:, :, 0]
        amax = np.abs(mx).astype(np.float64)
        live = amax > 0
        iscale = (np.float32(-127.0) / np.where(live, mx, np.float32(1.0))).astype(np.float32)
        v = (iscale[:, :, None] * rb).astype(np.float32).astype(np.float64)
        safe = np.where(live, amax, 1.0)[:, :, None]
        band = np.where(live[:, :, None],
                        127.0 / safe * dmid + np.abs(v) * (2 * dmid.max(axis=2, keepdims=True) / safe + 3 * U), 0.0)
        step = np.broadcast_to(np.abs((np.float32(1.0) / iscale).astype(np.float64))[:, :, None], rb.shape)
        for p, (t, k) in enumerate(tk):
            if live[p].any():
                out.append(SlotCodes(int(t), int(k), e, v[p].reshape(-1), band[p].reshape(-1),
                                     step[p].reshape(-1)))
    return sorted(out, key=lambda s: (s.token, s.slot))


def flip_risk(call, mid, bands=None) -> tuple[float, float]:
    """(NMSE, max|err|/rms) that `out` would show if every Q8_K code of mid inside its band rounded the
    other way, all at once and in the worst direction: the most a right kernel can lose on this call
    through the rounding of mid.  From the call's own weights, x and reference."""
    return _risk(token_flips(call, mid, bands=bands), *_out_scale(call))


def _out_scale(call) -> tuple[float, float]:
    """(sum of out^2, rms of out) over the whole output: the parity gate's NMSE and max|err|/rms divide by them."""
    ref = np.asarray(call.expect["out"], dtype=np.float64)
    den = float((ref * ref).sum())
    return den, float(np.sqrt(den / ref.size))


def _risk(flips, den, rms) -> tuple[float, float]:
    if not flips:
        return 0.0, 0.0
    if den == 0:
        return float("inf"), float("inf")
    return sum(g for g, _ in flips.values()) / den, max(e for _, e in flips.values()) / rms


def token_flips(call, mid, tokens=None, bands=None) -> dict[int, tuple[float, float]]:
    """Per token with an ambiguous code: (sum of |f_i . f_j| over its flips' columns f, the largest row sum of
    |f|): the most its flips, all at once and in the worst direction, add to |out - ref|^2 and to one
    element's |out - ref|.  A flip moves only its own token's row: tokens add, they have no cross terms."""
    a = call.args
    m = a["model_map"].array
    _, _, _, mid_dim, out_dim = _dims(call)
    dq = mo.MOE_TYPE_PAIRS[(int(a["gate_type"]), int(a["down_type"]))][1]
    by_expert = defaultdict(list)
    for s in code_bands(call, mid, tokens) if bands is None else bands:
        near = s.near()
        if near.any():
            by_expert[s.expert].append((s.token, near, s.step[near]))
    cols = defaultdict(list)  # token -> out_dim x flips: what each flip adds to out[token]
    for e, flips in by_expert.items():
        down = mo.expert_matrix(m, int(a["down_offset"]) + e * int(a["down_expert_bytes"]),
                                int(a["down_row_bytes"]), quant.row_bytes(dq, mid_dim), out_dim, dq, mid_dim)
        for t, near, step in flips:
            cols[t].append(down[:, near] * step)
    out = {}
    for t, cs in cols.items():
        f = np.concatenate(cs, axis=1)
        out[t] = (float(np.abs(f.T @ f).sum()), float(np.abs(f).sum(axis=1).max()))
    return out
