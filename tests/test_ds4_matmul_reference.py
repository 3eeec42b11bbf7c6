"""reference.ds4_matmul_ops checked against second formulations (pure numpy, CI).

Each op is computed a second way: scalar loops over ds4.c's definitions
(math.fsum dot products, hc_post_one's loops), our own block decoder with
integer codes (quant.quant_matvec_blockwise) instead of gguf-py, per-slot
loops instead of per-expert batching, and ds4_ops' older one-token MoE.  The
tests also measure what each spec's tolerance is there for (F16/TF32 rounding,
activations left in float) and show that a wrong decode (IQ2_XXS read as Q8_0,
Q2_K scale and min nibbles swapped, Q4_K minimum ignored, F16 read as bf16) is
far outside it.  Tolerances are the specs' own (imported from the spec files).
"""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import NO_DS4

from porter.gates.parity.compare import float_metrics, tolerance_violations
from porter.spec import Context
from reference import ds4_matmul_ops as mo
from reference import ds4_ops as ops
from reference import quant

SPECS = Path(__file__).resolve().parents[1] / "targets" / "ds4" / "parity"


def spec(unit):
    path = SPECS / f"{unit}.py"
    s = importlib.util.spec_from_file_location(f"test_spec_{unit}", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod.SPEC


def within(got, ref, tol):
    m = float_metrics(np.asarray(got, dtype=np.float32), np.asarray(ref, dtype=np.float32))
    return not tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs), m


def far_outside(got, ref, tol, factor=100.0):
    m = float_metrics(np.asarray(got, dtype=np.float32), np.asarray(ref, dtype=np.float32))
    return m["nmse"] is None or m["nmse"] > factor * tol.nmse, m


def fsum_dot(w_row, x_row):
    return math.fsum(float(a) * float(b) for a, b in zip(w_row, x_row))


# ---------------------------------------------------------------------------
# F16 / F32
# ---------------------------------------------------------------------------

def _dense_map(r, dtype, out_dim, in_dim, scale=None):
    w = (r.standard_normal((out_dim, in_dim)) * (scale or 1 / math.sqrt(in_dim))).astype(dtype)
    m, (off,) = Context.synthetic_map([w.view(np.uint8)], r)
    return m.array, off, w


def test_matmul_f16_matches_fsum_loop_and_bounds_f16_activations():
    r = np.random.default_rng(10)
    m, off, w = _dense_map(r, "<f2", 13, 257)
    x = r.standard_normal((3, 257)).astype(np.float32)
    got = mo.matmul_f16(m, off, 257, 13, x, 3)
    want = np.array([[fsum_dot(w[o].astype(np.float64), x[t]) for o in range(13)] for t in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    tol = spec("ds4_gpu_matmul_f16_tensor").outputs["out"]
    m, off, w = _dense_map(r, "<f2", 256, 4096)
    x = r.standard_normal((8, 4096)).astype(np.float32)
    ref = mo.matmul_f16(m, off, 4096, 256, x, 8)
    # upstream's prefill: x rounded to F16 for cuBLAS
    ok, met = within(mo.matmul_f16(m, off, 4096, 256, x.astype(np.float16).astype(np.float32), 8), ref, tol)
    assert ok and met["nmse"] < tol.nmse / 10, met
    # the halves read as bf16 (a wrong decode of F16 weights)
    bf = (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    bad, met = far_outside((x.astype(np.float64) @ bf.T), ref, tol)
    assert bad, met


def test_matmul_f16_pair_is_two_independent_projections():
    r = np.random.default_rng(11)
    wa = (r.standard_normal((9, 100)) * 0.1).astype("<f2")
    wb = (r.standard_normal((9, 100)) * 0.1).astype("<f2")
    m, (oa, ob) = Context.synthetic_map([wa.view(np.uint8), wb.view(np.uint8)], r)
    x = r.standard_normal((2, 100)).astype(np.float32)
    a, b = mo.matmul_f16_pair(m.array, oa, ob, 100, 9, x, 2)
    np.testing.assert_allclose(a, x.astype(np.float64) @ wa.astype(np.float64).T, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b, x.astype(np.float64) @ wb.astype(np.float64).T, rtol=1e-6, atol=1e-7)
    assert not np.allclose(a, b)
    with pytest.raises(ValueError):
        mo.matmul_f16_pair(m.array, oa, ob, 0, 9, x, 2)


def _tf32(a):
    """Round float32 to TF32 (10 explicit mantissa bits), round to nearest even."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def test_matmul_f32_matches_fsum_loop_and_bounds_tf32():
    r = np.random.default_rng(12)
    m, off, w = _dense_map(r, "<f4", 7, 33)
    x = r.standard_normal((2, 33)).astype(np.float32)
    got = mo.matmul_f32(m, off, 33, 7, x, 2)
    want = np.array([[fsum_dot(w[o], x[t]) for o in range(7)] for t in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    tol = spec("ds4_gpu_matmul_f32_tensor").outputs["out"]
    m, off, w = _dense_map(r, "<f4", 24, 16384)
    x = r.standard_normal((6, 16384)).astype(np.float32)
    ref = mo.matmul_f32(m, off, 16384, 24, x, 6)
    tf = _tf32(x).astype(np.float64) @ _tf32(w).astype(np.float64).T
    ok, met = within(tf, ref, tol)
    assert ok and met["nmse"] < tol.nmse / 5, met
    # the F32 weights read as F16 pairs (wrong element size)
    bad, met = far_outside(x[:, :8192].astype(np.float64) @ np.nan_to_num(
        w.view("<f2").astype(np.float64)[:, :8192], posinf=0, neginf=0).T, ref, tol)
    assert bad, met
    with pytest.raises(ValueError):
        mo.matmul_f32(m, off, 16384, 24, x, 0)


# ---------------------------------------------------------------------------
# Q8_0 projections (activations quantized to Q8_0, as ds4.c)
# ---------------------------------------------------------------------------

def _q8_map(r, rows, in_dim):
    raw = quant.random_blocks("Q8_0", rows, (in_dim + 31) // 32 * 32, r)
    m, (off,) = Context.synthetic_map([raw], r)
    return m.array, off, raw


def _q8_blockwise(raw, rows, in_dim, x):
    """Second formulation: our decoder's integer codes against ds4's Q8_0 activation, blockwise."""
    cols = (in_dim + 31) // 32 * 32
    q, d = ops.quantize_q8_0_activation(np.asarray(x, dtype=np.float32).reshape(1, -1))
    xd = (q.reshape(-1, 32).astype(np.float64) * d.reshape(-1, 1)).reshape(-1)
    return quant.quant_matvec_blockwise(raw, "Q8_0", rows, cols, xd)


def hc_post_loops(block, res, split, n_embd, n_hc):
    out = np.zeros((n_hc, n_embd))
    post, comb = split[n_hc:2 * n_hc], split[2 * n_hc:]
    for dst in range(n_hc):
        for d in range(n_embd):
            acc = float(block[d]) * float(post[dst])
            for src in range(n_hc):
                acc += float(comb[dst + src * n_hc]) * float(res[src][d])
            out[dst, d] = acc
    return out


@pytest.mark.parametrize("in_dim,n_embd,n_hc", [(100, 37, 4), (2080, 24, 3), (256, 16, 2)])
def test_q8_0_hc_expand_matches_blockwise_and_hc_post_loops(in_dim, n_embd, n_hc):
    r = np.random.default_rng(in_dim + n_hc)
    m, off, raw = _q8_map(r, n_embd, in_dim)
    x = r.standard_normal(in_dim).astype(np.float32)
    res = r.standard_normal((n_hc, n_embd)).astype(np.float32)
    split = r.uniform(-1, 1, 2 * n_hc + n_hc * n_hc).astype(np.float32)
    out_hc, block = mo.matmul_q8_0_hc_expand(m, off, in_dim, n_embd, x, res, split, n_embd, n_hc)
    np.testing.assert_allclose(block, _q8_blockwise(raw, n_embd, in_dim, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_hc, hc_post_loops(block, res, split, n_embd, n_hc), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        mo.matmul_q8_0_hc_expand(m, off, in_dim, n_embd + 1, x, res, split, n_embd, n_hc)


def test_q8_0_hc_expand_tolerance_bounds_float_activations_and_rejects_comb_transposed():
    r = np.random.default_rng(20)
    n_embd, in_dim, n_hc = 512, 8192, 4
    m, off, raw = _q8_map(r, n_embd, in_dim)
    x = r.standard_normal(in_dim).astype(np.float32)
    res = r.standard_normal((n_hc, n_embd)).astype(np.float32)
    split = r.uniform(-1, 1, 24).astype(np.float32)
    out_hc, block = mo.matmul_q8_0_hc_expand(m, off, in_dim, n_embd, x, res, split, n_embd, n_hc)
    s = spec("ds4_gpu_matmul_q8_0_hc_expand_tensor")
    block_f = ops.matmul_q8_0_unquantized(m, off, in_dim, n_embd, x, 1)[0]
    ok, met = within(block_f, block, s.outputs["block_out"])
    assert ok and met["nmse"] < s.outputs["block_out"].nmse / 2, met
    ok, met = within(mo.hc_post(block_f, res, split, n_embd, n_hc), out_hc, s.outputs["out_hc"])
    assert ok, met
    sp = split.copy()
    sp[8:] = split[8:].reshape(4, 4).T.reshape(-1)  # comb read transposed
    bad, met = far_outside(mo.hc_post(block, res, sp, n_embd, n_hc), out_hc, s.outputs["out_hc"])
    assert bad, met


def test_shared_down_adds_routed_only_into_the_hc_streams():
    r = np.random.default_rng(21)
    in_dim, n_embd, n_hc = 100, 37, 4
    m, off, raw = _q8_map(r, n_embd, in_dim)
    mid = r.standard_normal(in_dim).astype(np.float32)
    routed = r.standard_normal(n_embd).astype(np.float32)
    res = r.standard_normal((n_hc, n_embd)).astype(np.float32)
    split = r.uniform(-1, 1, 24).astype(np.float32)
    out_hc, shared = mo.shared_down_hc_expand_q8_0(m, off, in_dim, n_embd, mid, routed, res, split, n_embd, n_hc)
    np.testing.assert_allclose(shared, _q8_blockwise(raw, n_embd, in_dim, mid), rtol=1e-5, atol=1e-6)
    ffn = shared.astype(np.float64) + routed
    np.testing.assert_allclose(out_hc, hc_post_loops(ffn, res, split, n_embd, n_hc), rtol=1e-5, atol=1e-5)
    tol = spec("ds4_gpu_shared_down_hc_expand_q8_0_tensor").outputs["out_hc"]
    bad, met = far_outside(hc_post_loops(shared, res, split, n_embd, n_hc), out_hc, tol)  # routed ignored
    assert bad, met


def test_shared_gate_up_swiglu_matches_blockwise_and_clamps_only_mid():
    r = np.random.default_rng(22)
    in_dim, out_dim = 2080, 129
    raw_g = quant.random_blocks("Q8_0", out_dim, in_dim, r)
    raw_u = quant.random_blocks("Q8_0", out_dim, in_dim, r)
    m, (go, uo) = Context.synthetic_map([raw_g, raw_u], r)
    x = (r.standard_normal(in_dim) * 12).astype(np.float32)
    g, u, mid = mo.shared_gate_up_swiglu_q8_0(m.array, go, uo, in_dim, out_dim, x, 10.0)
    np.testing.assert_allclose(g, _q8_blockwise(raw_g, out_dim, in_dim, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u, _q8_blockwise(raw_u, out_dim, in_dim, x), rtol=1e-5, atol=1e-5)
    assert np.abs(g).max() > 10 and np.abs(u).max() > 10  # the clamp bites in mid, not in gate/up
    want = [min(a, 10.0) / (1 + math.exp(-min(a, 10.0))) * max(-10.0, min(10.0, b)) for a, b in zip(g.tolist(), u.tolist())]
    np.testing.assert_allclose(mid, want, rtol=1e-5, atol=1e-6)
    tol = spec("ds4_gpu_shared_gate_up_swiglu_q8_0_tensor").outputs["mid"]
    bad, met = far_outside(ops.swiglu(g, u, out_dim, 0.0, 1.0), mid, tol, factor=10)  # clamp ignored
    assert bad, met


# ---------------------------------------------------------------------------
# grouped attention output
# ---------------------------------------------------------------------------

def test_attention_low_matches_per_group_blockwise():
    r = np.random.default_rng(30)
    group_dim, rank, n_groups = 100, 7, 3
    m, off, raw = _q8_map(r, n_groups * rank, group_dim)
    heads = r.standard_normal((2, n_groups, group_dim)).astype(np.float32)
    low = mo.attention_output_low_q8(m, off, group_dim, rank, n_groups, heads, 2)
    rb = ops.q8_0_row_bytes(group_dim)
    for t in range(2):
        for g in range(n_groups):
            want = _q8_blockwise(raw.reshape(-1)[g * rank * rb:(g + 1) * rank * rb], rank, group_dim, heads[t, g])
            np.testing.assert_allclose(low[t, g * rank:(g + 1) * rank], want, rtol=1e-5, atol=1e-6)


def test_attention_batch_tolerance_bounds_the_f16_cublas_path():
    """Upstream's prefill path keeps heads and low in F16 (cuBLAS on F16-expanded
    weights); the spec's bounds must hold that, and not a group read as group 0."""
    r = np.random.default_rng(31)
    group_dim, rank, n_groups, out_dim, n_tok = 512, 128, 4, 256, 5
    raw_a = quant.random_blocks("Q8_0", n_groups * rank, group_dim, r)
    raw_b = quant.random_blocks("Q8_0", out_dim, n_groups * rank, r)
    m, (ao, bo) = Context.synthetic_map([raw_a, raw_b], r)
    heads = r.standard_normal((n_tok, n_groups, group_dim)).astype(np.float32)
    out, low = mo.attention_output_q8_batch(m.array, ao, bo, group_dim, rank, n_groups, out_dim, heads, n_tok)
    wa = quant.dequantize(raw_a, "Q8_0", (n_groups, rank, group_dim)).astype(np.float16).astype(np.float64)
    wb = quant.dequantize(raw_b, "Q8_0", (out_dim, n_groups * rank)).astype(np.float16).astype(np.float64)
    h16 = heads.astype(np.float16).astype(np.float64)
    low16 = np.einsum("grk,tgk->tgr", wa, h16).reshape(n_tok, -1).astype(np.float32)
    out16 = low16.astype(np.float16).astype(np.float64) @ wb.T
    s = spec("ds4_gpu_attention_output_q8_batch_tensor")
    for got, ref, name in ((low16, low, "low"), (out16, out, "out")):
        ok, met = within(got, ref, s.outputs[name])
        assert ok and met["nmse"] < s.outputs[name].nmse / 2, (name, met)
    h0 = np.repeat(heads[:, :1], n_groups, axis=1)
    bad, met = far_outside(mo.attention_output_low_q8(m.array, ao, group_dim, rank, n_groups, h0, n_tok), low,
                           s.outputs["low"])
    assert bad, met


# ---------------------------------------------------------------------------
# routed experts
# ---------------------------------------------------------------------------

def _moe_case(r, gq, dq, n_tok, n_expert, in_dim, mid, out, chosen_pool):
    def tensor(qt, rows, cols):
        rb = quant.row_bytes(qt, cols)
        per = rows * rb
        raw = r.integers(0, 256, ops.N_EXPERT * per, dtype=np.uint8)
        for e in chosen_pool:
            raw[e * per:(e + 1) * per] = quant.random_blocks(qt, rows, cols, r).reshape(-1)
        return raw, per, rb

    g, gp, grb = tensor(gq, mid, in_dim)
    u, _, _ = tensor(gq, mid, in_dim)
    d, dp, drb = tensor(dq, out, mid)
    m, (go, uo, do) = Context.synthetic_map([g, u, d], r)
    sel = np.array([r.choice(chosen_pool, n_expert, replace=False) for _ in range(n_tok)], dtype=np.int32)
    w = r.uniform(0.05, 0.6, (n_tok, n_expert)).astype(np.float32)
    x = (r.standard_normal((n_tok, in_dim)) * 3).astype(np.float32)
    types = (ops.GGML_TYPE[gq], ops.GGML_TYPE[dq])
    return dict(m=m.array, offs=(go, uo, do), types=types, strides=(gp, grb, dp, drb), sel=sel, w=w, x=x,
                dims=(in_dim, mid, out), n_expert=n_expert, n_tok=n_tok, qts=(gq, dq))


def _moe_ref(c, clamp=10.0, m=None):
    return mo.routed_moe(c["m"] if m is None else m, *c["offs"], *c["types"], *c["strides"], *c["dims"], c["sel"],
                         c["w"], c["n_expert"], clamp, c["x"], c["n_tok"])


def _moe_loops(c, clamp=10.0, m=None):
    """Second formulation: per token and slot, our own decoder's integer-code matvecs."""
    m = c["m"] if m is None else m
    (go, uo, do), (gp, grb, dp, drb) = c["offs"], c["strides"]
    in_dim, mid, out = c["dims"]
    gq, dq = c["qts"]
    res = np.zeros((c["n_tok"], out))
    mids = np.zeros((c["n_tok"], c["n_expert"], mid))
    for t in range(c["n_tok"]):
        xq, xd = ops.quantize_q8_K(c["x"][t][None, :])
        xv = (xq.reshape(-1, 256).astype(np.float64) * xd.reshape(-1, 1)).reshape(-1)
        for k in range(c["n_expert"]):
            e = int(c["sel"][t, k])
            gv = quant.quant_matvec_blockwise(m[go + e * gp: go + (e + 1) * gp], gq, mid, in_dim, xv)
            uv = quant.quant_matvec_blockwise(m[uo + e * gp: uo + (e + 1) * gp], gq, mid, in_dim, xv)
            gv, uv = np.minimum(gv, clamp), np.clip(uv, -clamp, clamp)
            mm = (gv / (1 + np.exp(-gv)) * uv * float(c["w"][t, k])).astype(np.float32)
            mids[t, k] = mm
            mq, md = ops.quantize_q8_K(mm[None, :])
            mv = (mq.reshape(-1, 256).astype(np.float64) * md.reshape(-1, 1)).reshape(-1)
            res[t] += quant.quant_matvec_blockwise(m[do + e * dp: do + (e + 1) * dp], dq, out, mid, mv)
    return res, mids


def _corrupt(c, which):
    """A copy of the map whose selected experts' blocks are decoded wrongly on purpose."""
    m = c["m"].copy()
    (go, uo, do), (gp, grb, dp, drb) = c["offs"], c["strides"]
    experts = sorted(set(int(e) for e in c["sel"].reshape(-1)))
    if which == "q2k-scales-swapped":  # each Q2_K scale byte's nibbles swapped: scale <-> min
        for e in experts:
            blk = m[do + e * dp: do + (e + 1) * dp].reshape(-1, 84)
            sc = blk[:, :16].copy()
            blk[:, :16] = (sc >> 4) | (sc << 4)
    elif which == "q4k-min-ignored":  # dmin = 0 in every down block
        for e in experts:
            blk = m[do + e * dp: do + (e + 1) * dp].reshape(-1, 144)
            blk[:, 2:4] = 0
    return m


def test_routed_moe_matches_ds4_ops_one_token_and_per_slot_loops():
    r = np.random.default_rng(40)
    c = _moe_case(r, "IQ2_XXS", "Q2_K", 1, 6, 512, 256, 256, [255, 3, 9, 77, 128, 0])
    out, mid = _moe_ref(c)
    o1, m1 = ops.routed_moe_one(c["m"], *c["offs"], *c["types"], *c["strides"], *c["dims"], c["sel"][0], c["w"][0],
                                6, 10.0, c["x"][0])
    np.testing.assert_array_equal(out[0], o1)
    np.testing.assert_array_equal(mid[0], m1)
    lo, lm = _moe_loops(c)
    np.testing.assert_allclose(mid, lm, rtol=1e-5, atol=1e-6)
    tol = spec("ds4_gpu_routed_moe_one_tensor").outputs["out"]
    ok, met = within(lo, out, tol)
    assert ok, met


@pytest.mark.parametrize("gq,dq", [("IQ2_XXS", "Q2_K"), ("Q4_K", "Q4_K")])
def test_routed_moe_batch_matches_per_slot_loops(gq, dq):
    r = np.random.default_rng(41)
    c = _moe_case(r, gq, dq, 5, 3, 256, 256, 64, [255, 1, 2, 40, 0])
    out, mid = _moe_ref(c)
    lo, lm = _moe_loops(c)
    np.testing.assert_allclose(mid, lm, rtol=1e-5, atol=1e-6)
    ok, met = within(lo, out, spec("ds4_gpu_routed_moe_batch_tensor").outputs["out"])
    assert ok, met


def test_routed_moe_wrong_decodes_are_far_outside_the_tolerance():
    r = np.random.default_rng(42)
    tol = spec("ds4_gpu_routed_moe_batch_tensor").outputs["out"]
    c = _moe_case(r, "IQ2_XXS", "Q2_K", 3, 6, 512, 256, 128, [255, 5, 6, 7, 8, 9, 0])
    out, _ = _moe_ref(c)
    # IQ2_XXS read as Q8_0: every gate/up block is its f16 scale then int8 quants
    (go, uo, do), (gp, grb, dp, drb) = c["offs"], c["strides"]
    xq, xd = ops.quantize_q8_K(c["x"])
    xv = (xq.reshape(3, -1, 256).astype(np.float64) * xd[:, :, None]).reshape(3, -1)
    as_q8 = np.zeros_like(out, dtype=np.float64)
    for t in range(3):
        for k in range(6):
            e = int(c["sel"][t, k])
            def q8_read(base):
                blk = c["m"][base + e * gp: base + (e + 1) * gp].reshape(-1, 66)
                d = blk[:, :2].copy().view("<f2").astype(np.float64)
                q = blk[:, 2:].view(np.int8).astype(np.float64)
                return (np.tile(q, (1, 4)) * d).reshape(256, -1)
            gv, uv = q8_read(go) @ xv[t], q8_read(uo) @ xv[t]
            mm = np.minimum(gv, 10) / (1 + np.exp(-np.minimum(gv, 10))) * np.clip(uv, -10, 10) * c["w"][t, k]
            dw = quant.dequantize(c["m"][do + e * dp: do + (e + 1) * dp], "Q2_K", (128, 256)).astype(np.float64)
            as_q8[t] += dw @ mm
    with np.errstate(all="ignore"):
        bad, met = far_outside(as_q8, out, tol)
    assert bad, met
    bad, met = far_outside(_moe_ref(c, m=_corrupt(c, "q2k-scales-swapped"))[0], out, tol)
    assert bad, met
    c4 = _moe_case(r, "Q4_K", "Q4_K", 1, 6, 256, 256, 128, [255, 5, 6, 7, 8, 0])
    out4, _ = _moe_ref(c4)
    bad, met = far_outside(_moe_ref(c4, m=_corrupt(c4, "q4k-min-ignored"))[0], out4, tol)
    assert bad, met


def test_routed_moe_refuses_what_the_call_refuses():
    r = np.random.default_rng(43)
    c = _moe_case(r, "IQ2_XXS", "Q2_K", 1, 2, 256, 256, 64, [255, 0])
    args = lambda **kw: {**dict(zip(("gate_type", "down_type"), c["types"])), **kw}  # noqa: E731
    for kw in ({"gate_type": 8}, {"gate_type": 12}, {"down_type": 12}):
        a = args(**kw)
        with pytest.raises(ValueError):
            mo.routed_moe(c["m"], *c["offs"], a["gate_type"], a["down_type"], *c["strides"], *c["dims"], c["sel"],
                          c["w"], 2, 10.0, c["x"], 1)
    with pytest.raises(ValueError):  # 256 down experts past the map end
        mo.routed_moe(c["m"], c["offs"][0], c["offs"][1], c["m"].size - 10, *c["types"], *c["strides"], *c["dims"],
                      c["sel"], c["w"], 2, 10.0, c["x"], 1)


def test_routed_moe_reference_is_the_same_to_the_bit_for_any_thread_count(monkeypatch):
    """The experts run in threads (their dequantisation is most of a prefill reference's time); their
    rows are summed in expert order, so the reference does not depend on the thread count."""
    from porter.spec import Context, load_spec
    from porter.gates.parity.gate import prepare
    from porter.target import load_target
    from reference import ds4_matmul_ops as M

    from conftest import ds4_checkout

    if ds4_checkout() is None:
        pytest.skip(NO_DS4 + " (the spec's inputs need ds4_gpu.h)")
    t = load_target(Path(__file__).resolve().parents[1], "ds4", ds4_checkout())
    spec = load_spec(t, "ds4_gpu_routed_moe_batch_tensor")
    shapes = [s for s in spec.shapes if s.expect == "ok" and s.dims.get("n_tokens", 1) > 1][:2]
    assert shapes
    small = __import__("dataclasses").replace(spec, shapes=shapes)
    got = {}
    for threads in (1, 4):
        monkeypatch.setattr(M, "MOE_REFERENCE_THREADS", threads)
        cases = prepare(small, t.api_function(spec.unit), Context.for_target(t), [7, 8])
        got[threads] = [c.calls[0].expect for c in cases]
    for a, b in zip(got[1], got[4]):
        for k in a:
            assert np.array_equal(a[k], b[k]), k
