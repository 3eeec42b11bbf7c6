"""reference.ds4_ops checked against second formulations (pure numpy, CI).

Each op is computed a second way -- scalar loops written from ds4.c's
definitions, our own block decoder instead of gguf-py, complex rotations,
repeated argmax -- and the two must agree.  Where the reference quantizes
activations (as ds4.c does), the tests also measure how far an unquantized
kernel sits from it, which is what the parity specs' tolerances allow for, and
show that a wrong weight decode (IQ2_XXS read as Q8_0) is far outside them.
"""
import math

import numpy as np
import pytest

from porter.gates.parity.compare import float_metrics, tolerance_violations
from reference import ds4_ops as ops
from reference import quant


def rng(seed=0):
    return np.random.default_rng(seed)


def within(got, ref, tol):
    m = float_metrics(got, ref)
    return not tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs), m


# ---------------------------------------------------------------------------
# norms, swiglu
# ---------------------------------------------------------------------------

def test_rms_norm_rows_matches_scalar_loop():
    r = rng(1)
    x = (r.standard_normal((5, 33)) * np.array([[0.1], [1], [3], [10], [0.5]])).astype(np.float32)
    got = ops.rms_norm_plain_rows(x, 33, 5, 1e-6)
    for i in range(5):
        ms = math.fsum(float(v) ** 2 for v in x[i]) / 33
        want = [float(v) / math.sqrt(ms + float(np.float32(1e-6))) for v in x[i]]
        np.testing.assert_allclose(got[i], want, rtol=1e-6)


def test_rms_norm_eps_and_rows_are_independent():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    got = ops.rms_norm_plain_rows(x, 2, 2, 0.5)
    np.testing.assert_allclose(got[0], np.array([3, 4]) / math.sqrt(12.5 + 0.5), rtol=1e-6)
    assert np.all(got[1] == 0)


def test_swiglu_scalar_loop_with_and_without_clamp():
    r = rng(2)
    g = (r.standard_normal(300) * 8).astype(np.float32)
    u = (r.standard_normal(300) * 8).astype(np.float32)
    for clamp, w in ((10.0, 1.0), (3.0, 0.37), (0.0, 2.0), (1e-7, 1.0)):
        got = ops.swiglu(g, u, 300, clamp, w)
        want = []
        for gi, ui in zip(g.tolist(), u.tolist()):
            if clamp > 1e-6:
                gi, ui = min(gi, clamp), max(-clamp, min(clamp, ui))
            want.append(gi / (1 + math.exp(-gi)) * ui * float(np.float32(w)))
        np.testing.assert_allclose(got, np.array(want, dtype=np.float32), rtol=2e-6, atol=1e-30)
    # the clamp is one-sided on the gate, two-sided on up
    out = ops.swiglu(np.array([-20.0, 20.0], np.float32), np.array([-20.0, 20.0], np.float32), 2, 10.0, 1.0)
    np.testing.assert_allclose(out, [(-20 / (1 + math.exp(20))) * -10, (10 / (1 + math.exp(-10))) * 10], rtol=1e-6)


# ---------------------------------------------------------------------------
# activation quantization
# ---------------------------------------------------------------------------

def _q8_0_scalar(row):
    """ds4.c quantize_q8_0_activation, one row, element by element in float32."""
    n = len(row)
    blocks = (n + 31) // 32
    q = np.zeros(blocks * 32, np.int8)
    d = np.zeros(blocks, np.float32)
    for b in range(blocks):
        vals = [np.float32(v) for v in row[b * 32:(b + 1) * 32]]
        amax = np.float32(0)
        for v in vals:
            amax = max(amax, np.float32(abs(v)))
        db = np.float32(amax / np.float32(127))
        idv = np.float32(1) / db if db != 0 else np.float32(0)
        d[b] = db
        for i, v in enumerate(vals):
            q[b * 32 + i] = max(-128, min(127, int(np.rint(np.float32(v * idv)))))
    return q, d


def test_q8_0_activation_matches_scalar_definition_with_partial_block():
    r = rng(3)
    x = r.standard_normal((3, 100)).astype(np.float32)
    x[1, 32:64] = 0  # an all-zero block: d = 0, q = 0
    q, d = ops.quantize_q8_0_activation(x)
    for t in range(3):
        qs, ds = _q8_0_scalar(x[t])
        assert np.array_equal(q[t], qs) and np.array_equal(d[t], ds)
    assert q.shape == (3, 128) and np.all(q[:, 100:] == 0) and d[1, 1] == 0


def test_q8_0_activation_rounds_half_to_even_like_lrintf():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 127.0  # d = 1, id = 1
    x[0, 1], x[0, 2], x[0, 3] = 2.5, 3.5, -2.5
    q, d = ops.quantize_q8_0_activation(x)
    assert d[0, 0] == 1.0 and q[0, :4].tolist() == [127, 2, 4, -2]


def _q8_K_scalar(row):
    """ggml/ds4.c quantize_row_q8_K, one block of 256 at a time, scalar."""
    q = np.zeros(len(row), np.int8)
    d = np.zeros(len(row) // 256, np.float32)
    for b in range(len(row) // 256):
        blk = row[b * 256:(b + 1) * 256]
        mx, amax = np.float32(0), np.float32(0)
        for v in blk:
            if abs(v) > amax:
                amax, mx = np.float32(abs(v)), np.float32(v)
        if amax == 0:
            continue
        iscale = np.float32(np.float32(-127) / mx)
        for i, v in enumerate(blk):
            q[b * 256 + i] = max(-128, min(127, int(np.rint(np.float32(iscale * v)))))
        d[b] = np.float32(np.float32(1) / iscale)
    return q, d


def test_q8_K_matches_scalar_definition():
    r = rng(4)
    x = r.standard_normal((2, 512)).astype(np.float32)
    x[1, :256] = 0
    x[0, 300] = 9.0  # largest magnitude positive: iscale = -127/max < 0, so d < 0 and q flips sign
    q, d = ops.quantize_q8_K(x)
    for t in range(2):
        qs, ds = _q8_K_scalar(x[t])
        assert np.array_equal(q[t], qs) and np.array_equal(d[t], ds)
    assert d[0, 1] < 0 and q[0, 300] == -127
    deq = q.astype(np.float64).reshape(2, 2, 256) * d[:, :, None]
    assert np.max(np.abs(deq.reshape(2, 512) - x)) <= np.max(np.abs(d)) / 2 + 1e-6
    with pytest.raises(ValueError):
        ops.quantize_q8_K(np.zeros((1, 100), np.float32))


# ---------------------------------------------------------------------------
# Q8_0 projection
# ---------------------------------------------------------------------------

def _matmul_q8_0_blockwise(raw, in_dim, out_dim, x):
    """Integer dot products per block with our own block parser: sum_b d_w d_x (q_w . q_x)."""
    blocks = (in_dim + 31) // 32
    bl = np.asarray(raw, np.uint8).reshape(-1).view(quant._DT_Q8_0).reshape(out_dim, blocks)
    qw = bl["qs"].astype(np.int64)
    dw = bl["d"].astype(np.float64)
    out = np.zeros((x.shape[0], out_dim))
    for t in range(x.shape[0]):
        qx, dx = _q8_0_scalar(x[t])
        qx = qx.reshape(blocks, 32).astype(np.int64)
        isum = np.einsum("obk,bk->ob", qw, qx)
        out[t] = (isum * dw * dx.astype(np.float64)[None, :]).sum(axis=1)
    return out.astype(np.float32)


@pytest.mark.parametrize("in_dim,out_dim,n_tok", [(256, 48, 3), (100, 37, 2), (2080, 9, 1)])
def test_matmul_q8_0_matches_integer_blockwise_formulation(in_dim, out_dim, n_tok):
    r = rng(in_dim)
    blocks = (in_dim + 31) // 32
    raw = quant.random_blocks("Q8_0", out_dim, blocks * 32, r)
    m = np.concatenate([r.integers(0, 256, 96, dtype=np.uint8), raw.reshape(-1), r.integers(0, 256, 50, dtype=np.uint8)])
    x = r.standard_normal((n_tok, in_dim)).astype(np.float32)
    got = ops.matmul_q8_0(m, 96, in_dim, out_dim, x, n_tok)
    want = _matmul_q8_0_blockwise(raw, in_dim, out_dim, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    with pytest.raises(ValueError):
        ops.matmul_q8_0(m, m.size - 10, in_dim, out_dim, x, n_tok)


def _load_spec_module(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "targets" / "ds4" / "parity" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ds4_spec_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_q8_0_tolerance_admits_float_activations_and_rejects_a_wrong_decode():
    """The spec's bounds: an F16/F32-activation kernel (no Q8_0 rounding of x) passes
    with margin on ds4's sizes; IQ2-style garbage (weights misread) does not."""
    tol = _load_spec_module("ds4_gpu_matmul_q8_0_tensor").TOL
    r = rng(5)
    for in_dim, out_dim, n_tok in ((4096, 2048, 3), (2048, 4096, 2), (4096, 512, 1)):
        raw = quant.random_blocks("Q8_0", out_dim, in_dim, r)
        x = r.standard_normal((n_tok, in_dim)).astype(np.float32)
        ref = ops.matmul_q8_0(raw, 0, in_dim, out_dim, x, n_tok)
        flt = ops.matmul_q8_0_unquantized(raw, 0, in_dim, out_dim, x, n_tok)
        ok, m = within(flt, ref, tol)
        assert ok and m["nmse"] < tol.nmse / 2.5 and m["max_err_rms"] < tol.max_err_rms / 1.5, m
        assert m["nmse"] > 1e-6  # the quantization is really in the reference
        # weights one block off (a wrong row stride) are far outside
        shifted = ops.matmul_q8_0(raw.reshape(-1)[34:], 0, in_dim, out_dim - 1, x, n_tok)
        assert not within(shifted, ref[:, :out_dim - 1], tol)[0]


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------

def _rope_complex(x, n_tok, n_head, head_dim, n_rot, pos0, n_ctx_orig, inverse, base, scale, ext, attn, bf, bs):
    """Second formulation: each pair as a complex number times mscale * e^(+-i theta),
    angles from the iterative product of ds4.c (theta *= base^(-2/n_rot))."""
    a = np.asarray(x, np.float64).reshape(n_tok, n_head, head_dim).copy()
    lo = hi = 0.0
    if ext:
        def corr(beta):
            return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(0.0, math.floor(corr(bf))), min(n_rot - 1.0, math.ceil(corr(bs)))
    for t in range(n_tok):
        theta_e = float(pos0 + t)
        for j in range(n_rot // 2):
            theta_i = scale * theta_e
            theta, ms = theta_i, attn
            if ext:
                ramp = 1 - min(1.0, max(0.0, (j - lo) / max(0.001, hi - lo)))
                theta = theta_i * (1 - ramp * ext) + theta_e * ramp * ext
                ms = attn * (1 + 0.1 * math.log(1 / scale))
            rot = ms * complex(math.cos(theta), (-1 if inverse else 1) * math.sin(theta))
            k = head_dim - n_rot + 2 * j
            z = (a[t, :, k] + 1j * a[t, :, k + 1]) * rot
            a[t, :, k], a[t, :, k + 1] = z.real, z.imag
            theta_e *= base ** (-2.0 / n_rot)
    return a.astype(np.float32)


YARN = dict(n_ctx_orig=65536, base=160000.0, scale=1 / 16, ext=1.0, attn=1 / (1 + 0.1 * math.log(16)), bf=32.0,
            bs=1.0)
DENSE = dict(n_ctx_orig=0, base=10000.0, scale=1.0, ext=0.0, attn=1.0, bf=32.0, bs=1.0)


@pytest.mark.parametrize("mode,inverse,pos0", [(DENSE, False, 5), (YARN, False, 4093), (YARN, True, 77),
                                               (DENSE, True, 1000)])
def test_rope_tail_matches_complex_rotation(mode, inverse, pos0):
    r = rng(pos0)
    n_tok, n_head, head_dim, n_rot = 3, 2, 96, 32
    x = r.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    got = ops.rope_tail(x, n_tok, n_head, head_dim, n_rot, pos0, mode["n_ctx_orig"], inverse, mode["base"],
                        mode["scale"], mode["ext"], mode["attn"], mode["bf"], mode["bs"])
    want = _rope_complex(x, n_tok, n_head, head_dim, n_rot, pos0, mode["n_ctx_orig"], inverse, float(np.float32(mode["base"])),
                         float(np.float32(mode["scale"])), mode["ext"], float(np.float32(mode["attn"])), mode["bf"],
                         mode["bs"])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(x).max()) * max(1.0, pos0 / 100))
    assert np.array_equal(got[..., :head_dim - n_rot], x[..., :head_dim - n_rot])  # only the tail moves


def test_rope_tail_identities():
    r = rng(7)
    x = r.standard_normal((1, 4, 64)).astype(np.float32)
    args = (0, True, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert np.allclose(ops.rope_tail(x, 1, 4, 64, 64, 0, *args[:1], False, *args[2:]), x, atol=0)  # position 0
    fwd = ops.rope_tail(x, 1, 4, 64, 64, 123, 0, False, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    back = ops.rope_tail(fwd, 1, 4, 64, 64, 123, 0, True, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    np.testing.assert_allclose(back, x, atol=1e-5)
    # YaRN with ds4's attn_factor keeps each pair's length
    y = ops.rope_tail(x, 1, 4, 64, 64, 999, 65536, False, 160000.0, 1 / 16, 1.0, 1 / (1 + 0.1 * math.log(16)), 32.0, 1.0)
    n0 = np.hypot(x[..., 0::2], x[..., 1::2])
    n1 = np.hypot(y[..., 0::2], y[..., 1::2])
    np.testing.assert_allclose(n1, n0, rtol=1e-5)
    for bad in ((33, 64), (64, 32)):
        with pytest.raises(ValueError):
            ops.rope_tail(np.zeros(2 * bad[1], np.float32), 1, 2, bad[1], bad[0], 0, 0, False, 1e4, 1, 0, 1, 32, 1)


def test_rope_tolerance_admits_float32_angles_and_rejects_neox_pairs():
    """A kernel computing theta in float32 at positions up to ~4100 stays inside the
    spec's bounds; the NeoX pair layout (x[i], x[i + n_rot/2]) does not."""
    mod = _load_spec_module("ds4_gpu_rope_tail_tensor")
    tol = mod.SPEC.outputs["x"]
    r = rng(8)
    n_tok, n_head, hd, n_rot, pos0 = 3, 64, 512, 64, 4093
    x = r.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    for mode in (mod.DENSE, mod.YARN):
        ref = ops.rope_tail(x, n_tok, n_head, hd, n_rot, pos0, mode["n_ctx_orig"], False, mode["freq_base"],
                            mode["freq_scale"], mode["ext_factor"], mode["attn_factor"], mode["beta_fast"],
                            mode["beta_slow"])
        f32 = _rope_f32(x, n_tok, n_head, hd, n_rot, pos0, mode)
        ok, m = within(f32, ref, tol)
        assert ok and m["max_err_rms"] < tol.max_err_rms / 2, m
        neox = _rope_f32(x, n_tok, n_head, hd, n_rot, pos0, mode, neox=True)
        assert not within(neox, ref, tol)[0]


def _rope_f32(x, n_tok, n_head, hd, n_rot, pos0, mode, neox=False):
    """theta = float32(pos) * powf(base, -p/n_rot), everything float32 (a GPU kernel's arithmetic)."""
    f = np.float32
    a = x.copy()
    base, scale, ext, attn = f(mode["freq_base"]), f(mode["freq_scale"]), f(mode["ext_factor"]), f(mode["attn_factor"])
    j = np.arange(n_rot // 2)
    lo, hi = (ops.rope_yarn_corr_dims(n_rot, mode["n_ctx_orig"], float(base), mode["beta_fast"], mode["beta_slow"])
              if ext else (0.0, 0.0))
    for t in range(n_tok):
        te = f(pos0 + t) * np.power(base, (-(2 * j).astype(np.float32) / f(n_rot)).astype(np.float32)).astype(f)
        ti = (scale * te).astype(f)
        if ext:
            mix = (f(1) - np.clip((j.astype(f) - f(lo)) / f(max(0.001, hi - lo)), 0, 1)).astype(f) * ext
            th = (ti * (f(1) - mix) + te * mix).astype(f)
            ms = attn * f(1 + 0.1 * math.log(1 / float(scale)))
        else:
            th, ms = ti, attn
        c, s = (np.cos(th) * ms).astype(f), (np.sin(th) * ms).astype(f)
        tail = a[t, :, hd - n_rot:]
        if neox:
            x0, x1 = tail[:, :n_rot // 2].copy(), tail[:, n_rot // 2:].copy()
            tail[:, :n_rot // 2], tail[:, n_rot // 2:] = x0 * c - x1 * s, x0 * s + x1 * c
        else:
            x0, x1 = tail[:, 0::2].copy(), tail[:, 1::2].copy()
            tail[:, 0::2], tail[:, 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    return a


# ---------------------------------------------------------------------------
# indexer top-k
# ---------------------------------------------------------------------------

def _topk_repeated_argmax(row, k):
    """ds4.c: k times, the best not-yet-chosen score by a strict '>' scan from index 0."""
    chosen, out = np.zeros(len(row), bool), []
    for _ in range(k):
        best, best_s = -1, -np.inf
        for c, s in enumerate(row):
            if not chosen[c] and (best < 0 or s > best_s):
                best, best_s = c, s
        chosen[best] = True
        out.append(best)
    return out


@pytest.mark.parametrize("levels", [None, 3, 8])
def test_indexer_topk_matches_repeated_argmax_with_ties(levels):
    r = rng(9 if levels is None else levels)
    n_tok, n_comp, k = 3, 70, 20
    if levels:
        vals = r.standard_normal(levels).astype(np.float32)
        s = vals[r.integers(0, levels, (n_tok, n_comp))]
    else:
        s = r.standard_normal((n_tok, n_comp)).astype(np.float32)
    got = ops.indexer_topk(s, n_comp, n_tok, k)
    for t in range(n_tok):
        assert got[t].tolist() == _topk_repeated_argmax(s[t].tolist(), k)
    assert got.dtype == np.int32


def test_indexer_topk_errors_and_full_selection():
    s = np.array([[1.0, 3.0, 3.0, 2.0]], np.float32)
    assert ops.indexer_topk(s, 4, 1, 4).tolist() == [[1, 2, 3, 0]]
    for k in (0, 5):
        with pytest.raises(ValueError):
            ops.indexer_topk(s, 4, 1, k)


# ---------------------------------------------------------------------------
# routed experts
# ---------------------------------------------------------------------------

def _moe_setup(r, n_slots=3, in_dim=256, mid=256, out=256, x_scale=1.0, n_all=8):
    """A map with n_all experts per tensor (the reference checks 256 fit, so pad the map)."""
    g_rb, d_rb = quant.row_bytes("IQ2_XXS", in_dim), quant.row_bytes("Q2_K", mid)
    g_per, d_per = mid * g_rb, out * d_rb
    gate = quant.random_blocks("IQ2_XXS", n_all * mid, in_dim, r).reshape(-1)
    up = quant.random_blocks("IQ2_XXS", n_all * mid, in_dim, r).reshape(-1)
    down = quant.random_blocks("Q2_K", n_all * out, mid, r).reshape(-1)
    g_off, u_off = 64, 64 + gate.size
    d_off = u_off + up.size
    size = d_off + ops.N_EXPERT * d_per  # room for 256 down experts (the call's bound)
    m = np.zeros(size + ops.N_EXPERT * g_per * 2, np.uint8)
    m[g_off:g_off + gate.size] = gate
    m[u_off:u_off + up.size] = up
    m[d_off:d_off + down.size] = down
    ids = r.permutation(n_all)[:n_slots].astype(np.int32)
    w = r.uniform(0.1, 0.5, n_slots).astype(np.float32)
    x = (r.standard_normal(in_dim) * x_scale).astype(np.float32)
    return dict(m=m, g_off=g_off, u_off=u_off, d_off=d_off, g_per=g_per, g_rb=g_rb, d_per=d_per, d_rb=d_rb,
                in_dim=in_dim, mid=mid, out=out, ids=ids, w=w, x=x, n=n_slots)


def _moe(s, clamp=10.0, gate_type=16):
    return ops.routed_moe_one(s["m"], s["g_off"], s["u_off"], s["d_off"], gate_type, 10, s["g_per"], s["g_rb"],
                              s["d_per"], s["d_rb"], s["in_dim"], s["mid"], s["out"], s["ids"], s["w"], s["n"],
                              clamp, s["x"])


def _moe_second(s, clamp=10.0):
    """Per slot with our own block decoder (quant_matvec_blockwise) and scalar Q8_K."""
    qx, dx = _q8_K_scalar(s["x"])
    xv = (qx.reshape(-1, 256).astype(np.float64) * dx.astype(np.float64)[:, None]).reshape(-1)
    out = np.zeros(s["out"])
    mids = []
    for k in range(s["n"]):
        e = int(s["ids"][k])
        g = quant.quant_matvec_blockwise(s["m"][s["g_off"] + e * s["g_per"]:][:s["g_per"]], "IQ2_XXS", s["mid"],
                                         s["in_dim"], xv)
        u = quant.quant_matvec_blockwise(s["m"][s["u_off"] + e * s["g_per"]:][:s["g_per"]], "IQ2_XXS", s["mid"],
                                         s["in_dim"], xv)
        if clamp > 1e-6:
            g, u = np.minimum(g, clamp), np.clip(u, -clamp, clamp)
        mid = (g / (1 + np.exp(-g)) * u * float(s["w"][k])).astype(np.float32)
        mids.append(mid)
        qm, dm = _q8_K_scalar(mid)
        mv = (qm.reshape(-1, 256).astype(np.float64) * dm.astype(np.float64)[:, None]).reshape(-1)
        out += quant.quant_matvec_blockwise(s["m"][s["d_off"] + e * s["d_per"]:][:s["d_per"]], "Q2_K", s["out"],
                                            s["mid"], mv)
    return out.astype(np.float32), np.stack(mids)


@pytest.mark.parametrize("clamp,x_scale", [(10.0, 1.0), (10.0, 6.0), (0.0, 1.0)])
def test_routed_moe_one_matches_per_slot_independent_decoder(clamp, x_scale):
    r = rng(int(x_scale * 10 + clamp))
    s = _moe_setup(r, n_slots=3, in_dim=512, mid=256, out=256, x_scale=x_scale)
    out, mid = _moe(s, clamp)
    out2, mid2 = _moe_second(s, clamp)
    # mid agrees to float32 rounding; out too, except where float32 mid rounds to another Q8_K code
    assert within(mid2, mid, _load_spec_module("ds4_gpu_routed_moe_one_tensor").SPEC.outputs["mid"])[0]
    ok, m = within(out2, out, _load_spec_module("ds4_gpu_routed_moe_one_tensor").SPEC.outputs["out"])
    assert ok and m["nmse"] < 1e-9, m
    if x_scale > 1:  # the clamp really bites at this scale
        assert np.any(np.abs(mid) > 0) and clamp > 0


def test_routed_moe_rejects_iq2_read_as_q8_0_and_bad_calls():
    r = rng(11)
    s = _moe_setup(r, n_slots=2)
    out, mid = _moe(s)
    spec = _load_spec_module("ds4_gpu_routed_moe_one_tensor").SPEC
    # the mutant's arithmetic: each 66-byte block's f16 scale times its payload bytes as int8
    qx, dx = ops.quantize_q8_K(s["x"][None, :])
    bad = np.zeros_like(mid, dtype=np.float64)
    for k in range(s["n"]):
        e = int(s["ids"][k])
        gu = []
        for base in (s["g_off"], s["u_off"]):
            v = np.zeros(s["mid"])
            for row in range(s["mid"]):
                blk = s["m"][base + e * s["g_per"] + row * s["g_rb"]:][:66]
                d = float(blk[:2].view("<f2")[0])
                qw = blk[2:].view(np.int8).astype(np.int64)
                v[row] = d * float(dx[0, 0]) * float(np.sum(qw[np.arange(256) & 63] * qx[0].astype(np.int64)))
            gu.append(v)
        g, u = np.minimum(gu[0], 10.0), np.clip(gu[1], -10.0, 10.0)
        bad[k] = g / (1 + np.exp(-g)) * u * float(s["w"][k])
    assert not within(bad.astype(np.float32), mid, spec.outputs["mid"])[0]
    for gate_type in (8, 12):
        with pytest.raises(ValueError):
            _moe(s, gate_type=gate_type)
    small = dict(s, m=s["m"][: s["d_off"] + 8 * s["d_per"]])
    with pytest.raises(ValueError):
        _moe(small)


def test_routed_moe_negative_id_reads_expert_zero():
    r = rng(12)
    s = _moe_setup(r, n_slots=2)
    s["ids"] = np.array([-1, 3], np.int32)
    a = _moe(s)
    s["ids"] = np.array([0, 3], np.int32)
    b = _moe(s)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
