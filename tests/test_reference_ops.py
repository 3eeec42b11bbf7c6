"""reference.minimoe_ops against second formulations and hand-computed cases.

Each op reference is checked against something written differently: a closed
form computed by hand, a different algorithm (complex multiplication for RoPE,
an explicit mask matrix / an extra zero-value key for the sink attention,
per-token loops over the independent blockwise quant matvec for the routed
experts), or an invariant of the contract (RoPE at position 0 is the identity,
the router's tie rule on a constructed tie).  Both sides compute in float64 and
return float32, so they agree to float32 rounding: tolerance rel 2e-6.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import reference.minimoe_ops as ops
import reference.quant as rq
from reference.quant import QT

TOL = 2e-6   # both sides float64 inside, float32 out: a few float32 ulps


def close(got, want, tol=TOL):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.abs(got - want).max()) if got.size else 0.0
    scale = max(1.0, float(np.abs(want).max()) if want.size else 0.0)
    assert err <= tol * scale, f"max abs err {err:.3g} > {tol * scale:.3g}"
    return err


class MapBuilder:
    """A synthetic model map: blobs appended at 32-byte aligned offsets."""

    def __init__(self):
        self.buf = bytearray(b"\xAA" * 7)     # nothing starts at 0

    def add(self, data) -> int:
        pad = (-len(self.buf)) % 32
        self.buf += b"\xAA" * pad
        off = len(self.buf)
        self.buf += bytes(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        return off

    def map(self) -> np.ndarray:
        return np.frombuffer(bytes(self.buf), dtype=np.uint8)


# ---------------------------------------------------------------------------
# Embedding, norms, elementwise
# ---------------------------------------------------------------------------

def test_embed_rows_and_out_of_range():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, 6)).astype(np.float16)
    mb = MapBuilder()
    off = mb.add(table)
    m = mb.map()
    out = ops.embed_rows([9, 0, 3, 3], m, off, 10, 6, 4)
    assert out.dtype == np.float32
    assert np.array_equal(out, table[[9, 0, 3, 3]].astype(np.float32))
    for bad in ([10], [-1]):
        with pytest.raises(ValueError):
            ops.embed_rows(bad, m, off, 10, 6, 1)
    with pytest.raises(ValueError):                       # table runs past the map
        ops.embed_rows([0], m, off + 8, 10, 6, 1)


def test_rms_norm_hand_values():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    out = ops.rms_norm_plain_rows(x, 2, 2, 0.0 + 1e-6)
    r = math.sqrt((9 + 16) / 2 + 1e-6)
    close(out[0], [3 / r, 4 / r])
    assert np.array_equal(out[1], [0.0, 0.0])            # eps keeps a zero row finite
    mb = MapBuilder()
    off = mb.add(np.array([2.0, -1.0], dtype=np.float32))
    outw = ops.rms_norm_weight_rows(x, mb.map(), off, 2, 2, 1e-6)
    close(outw[0], [6 / r, -4 / r])


def test_rms_norm_unit_rms():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64)).astype(np.float32) * 7
    out = ops.rms_norm_plain_rows(x, 64, 5, 1e-6).astype(np.float64)
    close(np.sqrt((out ** 2).mean(axis=1)), np.ones(5), 1e-6)


def test_swiglu_add_checksum_hand_values():
    g = np.array([0.0, 1.0, -1.0, 30.0, -30.0], dtype=np.float32)
    u = np.array([5.0, 2.0, 2.0, 1.0, 1.0], dtype=np.float32)
    s = 1 / (1 + math.exp(-1))
    close(ops.swiglu(g, u, 5), [0.0, 2 * s, -2 * (1 - s), 30.0, -30 * math.exp(-30)])
    close(ops.add(g, u, 5), g.astype(np.float64) + u)
    assert np.array_equal(ops.debug_checksum(np.array([1, 2, 3, 99], np.float32), 3), [6.0, 14.0])


# ---------------------------------------------------------------------------
# Dense projections
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("qt", [QT.Q8_0, QT.F16, QT.Q4_K], ids=lambda q: q.name)
def test_matmuls_against_blockwise_formulation(qt):
    rng = np.random.default_rng(2)
    out_dim, in_dim, n_tok = 40, 512, 3
    raw = rq.random_blocks(qt, out_dim, in_dim, rng)
    mb = MapBuilder()
    off = mb.add(raw)
    x = rng.standard_normal((n_tok, in_dim)).astype(np.float32)
    fn = {QT.Q8_0: ops.matmul_q8_0, QT.F16: ops.matmul_f16, QT.Q4_K: ops.matmul_q4_k}[qt]
    got = fn(mb.map(), off, in_dim, out_dim, x, n_tok)
    assert got.shape == (n_tok, out_dim) and got.dtype == np.float32
    close(got, rq.quant_matvec_blockwise(raw, qt, out_dim, in_dim, x))
    with pytest.raises(ValueError):
        fn(mb.map(), off + 1_000_000, in_dim, out_dim, x, n_tok)


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------

def rope_complex(x, pos0, n_rot, freq_base):
    """Second formulation: tail pairs as complex numbers times e^{i theta}."""
    n_tok, n_head, head_dim = x.shape
    y = x.astype(np.float64).copy()
    tail = y[:, :, head_dim - n_rot:]
    z = tail[..., 0::2] + 1j * tail[..., 1::2]
    for t in range(n_tok):
        for j in range(n_rot // 2):
            theta = (pos0 + t) * freq_base ** (-2.0 * j / n_rot)
            z[t, :, j] *= complex(math.cos(theta), math.sin(theta))
    tail[..., 0::2] = z.real
    tail[..., 1::2] = z.imag
    return y


def test_rope_position_zero_is_identity_and_head_untouched():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 64)).astype(np.float32)
    assert np.array_equal(ops.rope_tail(x, 1, 4, 64, 16, 0, 10000.0), x)
    x = rng.standard_normal((5, 4, 64)).astype(np.float32)
    y = ops.rope_tail(x, 5, 4, 64, 16, 123, 10000.0)
    assert np.array_equal(y[:, :, :48], x[:, :, :48])    # only the last n_rot dims rotate
    assert not np.allclose(y[:, :, 48:], x[:, :, 48:])


@pytest.mark.parametrize("pos0,n_tok,n_head,head_dim,n_rot", [(0, 7, 4, 64, 16), (37, 3, 1, 64, 16),
                                                              (5, 2, 3, 8, 8), (1000, 1, 2, 32, 2)])
def test_rope_matches_complex_formulation(pos0, n_tok, n_head, head_dim, n_rot):
    rng = np.random.default_rng(pos0)
    x = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    close(ops.rope_tail(x, n_tok, n_head, head_dim, n_rot, pos0, 10000.0), rope_complex(x, pos0, n_rot, 10000.0))


def test_rope_dot_depends_on_relative_position_only():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64)).astype(np.float32)
    dots = []
    for p in (0, 10, 250):
        qr = ops.rope_tail(q, 1, 1, 64, 16, p + 3, 10000.0).astype(np.float64)
        kr = ops.rope_tail(k, 1, 1, 64, 16, p, 10000.0).astype(np.float64)
        dots.append(float((qr * kr).sum()))
    assert max(dots) - min(dots) < 1e-5


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------

def attention_masked(q, k, v, sinks, pos0, window, scale):
    """Second formulation: one score matrix over all cached keys, a boolean
    window mask, and the sink as an extra key whose value is the zero vector."""
    n_tok, n_head, head_dim = q.shape
    n_pos = k.shape[0]
    qpos = pos0 + np.arange(n_tok)[:, None]
    kpos = np.arange(n_pos)[None, :]
    visible = (kpos <= qpos) & (kpos > qpos - window)                  # (n_tok, n_pos)
    s = scale * np.einsum("thd,jd->thj", q.astype(np.float64), k.astype(np.float64))
    s = np.where(visible[:, None, :], s, -np.inf)
    s = np.concatenate([s, np.broadcast_to(sinks[None, :, None], (n_tok, n_head, 1))], axis=-1)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    v_ext = np.concatenate([v.astype(np.float64), np.zeros((1, head_dim))], axis=0)
    return np.einsum("thj,jd->thd", p, v_ext)


def _attn_case(rng, n_tok, pos0, n_head, head_dim, sinks):
    n_pos = pos0 + n_tok
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_pos, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_pos, head_dim)).astype(np.float32)
    mb = MapBuilder()
    off = mb.add(np.asarray(sinks, dtype=np.float32))
    return q, k, v, mb.map(), off


@pytest.mark.parametrize("n_tok,pos0,window", [(1, 0, 32), (7, 0, 32), (3, 40, 32), (7, 5, 4), (1, 100, 1), (5, 2, 3)])
def test_attention_matches_masked_formulation(n_tok, pos0, window):
    rng = np.random.default_rng(n_tok * 100 + pos0)
    sinks = [0.5, -2.0, 3.0, 0.0]
    q, k, v, m, off = _attn_case(rng, n_tok, pos0, 4, 16, sinks)
    scale = 1 / math.sqrt(16)
    got = ops.attention_window(q, k, v, m, off, n_tok, pos0, 4, 16, window, scale)
    close(got, attention_masked(q, k, v, np.array(sinks), pos0, window, scale))


def test_attention_without_sink_and_full_window_is_plain_softmax():
    rng = np.random.default_rng(6)
    n_tok, head_dim = 6, 8
    q, k, v, m, off = _attn_case(rng, n_tok, 0, 2, head_dim, [-np.inf, -np.inf])
    got = ops.attention_window(q, k, v, m, off, n_tok, 0, 2, head_dim, 1000, 0.3)
    for t in range(n_tok):
        for h in range(2):
            s = 0.3 * k[: t + 1].astype(np.float64) @ q[t, h]
            p = np.exp(s - s.max())
            p /= p.sum()
            close(got[t, h], p @ v[: t + 1])
    # first token sees only itself: out = v_0 exactly (up to rounding)
    close(got[0, 0], v[0])


def test_attention_sink_takes_mass_but_no_value():
    rng = np.random.default_rng(7)
    q, k, v, m, off = _attn_case(rng, 1, 0, 1, 4, [math.log(3.0)])
    q[:] = 0.0                                            # s_0 = 0: weights 1 (key) vs 3 (sink)
    got = ops.attention_window(q, k, v, m, off, 1, 0, 1, 4, 8, 1.0)
    close(got[0, 0], v[0] / 4.0)


# ---------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------

def test_router_tie_rule_on_constructed_ties():
    logits = np.array([
        [1.0, 3.0, 3.0, 0.0, -1.0, 3.0, 2.0, 0.5],     # three-way tie for first: 1, 2 (then 5)
        [0.0] * 8,                                      # all equal: 0, 1
        [5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0],       # clear first, tie for second: 0, 1
        [-1.0, -1.0, -1.0, 2.0, -1.0, -1.0, -1.0, 2.0],  # tie between 3 and 7: 3, 7
    ], dtype=np.float32)
    ids, w = ops.router_topk(logits, 8, 4, 2)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert ids.tolist() == [[1, 2], [0, 1], [0, 1], [3, 7]]
    close(w[0], [0.5, 0.5])
    close(w[1], [0.5, 0.5])
    e = math.exp(1.0)
    close(w[2], [e / (e + 1), 1 / (e + 1)])
    ids3, _ = ops.router_topk(logits, 8, 4, 3)
    assert ids3[0].tolist() == [1, 2, 5]


def test_router_weights_are_renormalised_top_p():
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((7, 8)).astype(np.float32) * 2
    ids, w = ops.router_topk(logits, 8, 7, 2)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    for t in range(7):
        order = sorted(range(8), key=lambda e: (-p[t, e], e))[:2]
        assert ids[t].tolist() == order
        close(w[t], p[t, order] / p[t, order].sum())
    close(w.sum(axis=1), np.ones(7))
    with pytest.raises(ValueError):
        ops.router_topk(logits, 8, 7, 9)


# ---------------------------------------------------------------------------
# Routed experts
# ---------------------------------------------------------------------------

def _experts(rng, qt, n_expert, rows, cols):
    raw = rq.random_blocks(qt, n_expert * rows, cols, rng)
    return raw.reshape(n_expert, rows, -1)


def test_routed_gate_up_and_down_against_per_slot_blockwise_loops():
    rng = np.random.default_rng(9)
    n_expert, n_embd, n_ff, n_tok, top_k = 5, 256, 512, 3, 2
    gate_raw = _experts(rng, QT.IQ2_XXS, n_expert, n_ff, n_embd)
    up_raw = _experts(rng, QT.IQ2_XXS, n_expert, n_ff, n_embd)
    down_raw = _experts(rng, QT.Q2_K, n_expert, n_embd, n_ff)
    mb = MapBuilder()
    g_off, u_off, d_off = mb.add(gate_raw), mb.add(up_raw), mb.add(down_raw)
    m = mb.map()
    # expert e's matrix starts e * n_ff * (n_embd/256) * 66 bytes after the tensor
    assert gate_raw[1].ctypes.data - gate_raw[0].ctypes.data == n_ff * (n_embd // 256) * 66
    x = rng.standard_normal((n_tok, n_embd)).astype(np.float32)
    ids = np.array([[4, 0], [2, 2], [1, 4]], dtype=np.int32)        # repeated expert in one token too
    gate, up = ops.routed_gate_up_iq2_xxs(m, g_off, u_off, n_embd, n_ff, n_expert, x, ids, n_tok, top_k)
    assert gate.shape == up.shape == (n_tok, top_k, n_ff)
    for t in range(n_tok):
        for k in range(top_k):
            e = ids[t, k]
            close(gate[t, k], rq.quant_matvec_blockwise(gate_raw[e], QT.IQ2_XXS, n_ff, n_embd, x[t]))
            close(up[t, k], rq.quant_matvec_blockwise(up_raw[e], QT.IQ2_XXS, n_ff, n_embd, x[t]))
    mid = ops.swiglu(gate, up, gate.size).reshape(gate.shape)
    w = np.array([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]], dtype=np.float32)
    out = ops.routed_down_q2_k(m, d_off, n_ff, n_embd, n_expert, mid, ids, w, n_tok, top_k)
    assert out.shape == (n_tok, n_embd)
    for t in range(n_tok):
        want = sum(float(w[t, k]) * rq.quant_matvec_blockwise(down_raw[ids[t, k]], QT.Q2_K, n_embd, n_ff, mid[t, k])
                   for k in range(top_k))
        close(out[t], want)
    bad = ids.copy()
    bad[1, 0] = n_expert
    with pytest.raises(ValueError):
        ops.routed_gate_up_iq2_xxs(m, g_off, u_off, n_embd, n_ff, n_expert, x, bad, n_tok, top_k)
    with pytest.raises(ValueError):
        ops.routed_down_q2_k(m, d_off, n_ff, n_embd, n_expert, mid, bad, w, n_tok, top_k)
