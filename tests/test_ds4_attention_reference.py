"""reference.ds4_attention_ops checked against second formulations (pure numpy, CI).

Each op is computed a second way -- scalar loops with frexp-based rounding, a
Hadamard matrix instead of the butterfly, Python's own f16 packing, softmax by
log-sum-exp instead of max-subtraction, the compressor window by window instead
of token by token -- and the two must agree.  Each test also builds a plausible
wrong variant (sinks ignored, window off by one, FP8 saturating at 240, the
ratio-4 overlap dropped, ...) and shows it far outside the tolerance of the
parity spec that uses the reference.
"""
import math
import struct

import numpy as np
import pytest

from porter.gates.parity.compare import float_metrics, tolerance_violations
from reference import ds4_attention_ops as A
from reference import ds4_ops as base

ATTN_TOL = dict(nmse=1e-6, max_err_rms=1e-2, max_abs=None)  # targets/ds4/parity/_attn_inputs.ATTN_TOL
ROW_TOL = dict(nmse=1e-5, max_err_rms=0.5, max_abs=None)    # the compressor specs' row bound
INDEXER_TOL = dict(nmse=1e-9, max_err_rms=1e-4, max_abs=1e-4)


def rng(seed=0):
    return np.random.default_rng(seed)


def violations(got, ref, tol):
    return tolerance_violations(float_metrics(got, ref), **tol)


def nmse(got, ref):
    return float_metrics(got, ref)["nmse"]


# ---------------------------------------------------------------------------
# FP8 E4M3 and FP4 E2M1 round trips
# ---------------------------------------------------------------------------

def _round_float(v, mant_bits, min_exp, vmax, sat=None):
    """Nearest value with `mant_bits` explicit mantissa bits (subnormal below 2^min_exp),
    ties to even, via frexp -- a second derivation of the E4M3 / E2M1 tables."""
    a = min(abs(v), vmax if sat is None else sat)
    if a == 0:
        return 0.0
    e = max(math.frexp(a)[1] - 1, min_exp)
    quantum = 2.0 ** (e - mant_bits)
    q = round(a / quantum) * quantum  # Python's round: half to even
    return math.copysign(min(q, vmax), v)


def _fp8_row_scalar(row, n_rot, sat=None, floor=1e-4):
    out = list(map(float, row))
    n_nope = len(row) - n_rot
    for off in range(0, n_nope, 64):
        blk = [np.float32(x) for x in row[off:off + 64]]
        amax = max(abs(float(x)) for x in blk)
        amax = max(amax, floor) if floor else amax
        scale = 2.0 ** math.ceil(math.log2(np.float32(np.float32(amax) / np.float32(448.0))))
        for i, x in enumerate(blk):
            v = max(-448.0, min(448.0, float(x) / scale))
            out[off + i] = _round_float(v, 3, -6, 448.0, sat) * scale
    return np.array(out, np.float32)


def test_fp8_round_trip_matches_a_frexp_scalar_loop_bit_for_bit():
    r = rng(1)
    x = r.standard_normal((6, 512)).astype(np.float32) * np.array([[1], [1e-3], [30], [1e-6], [1e4], [1]],
                                                                  np.float32)
    x[5, :64] = 0.0  # an all-zero block
    # exact midpoints between codes, with amax = 448 * 2^k
    t = A.e4m3fn_table()
    codes = r.integers(1, 125, 64)
    x[0, 64:128] = (t[codes] + t[codes + 1]) / 2 * 4.0
    x[0, 64] = 448.0 * 4.0
    got = A.dsv4_fp8_kv_quantize(x, 6, 512, 64)
    for i in range(6):
        np.testing.assert_array_equal(got[i], _fp8_row_scalar(x[i], 64))
    assert np.array_equal(got[:, 448:], x[:, 448:])  # the RoPE tail is untouched
    # table sanity: 448 is the largest finite E4M3FN value, 2^-9 the smallest subnormal
    assert t[-1] == 448.0 and t[1] == 2.0 ** -9 and t.size == 127


def test_fp8_wrong_variants_are_far_outside_bit_exactness():
    r = rng(2)
    x = r.standard_normal((16, 512)).astype(np.float32)
    good = A.dsv4_fp8_kv_quantize(x, 16, 512, 64)
    # saturating at 240 (the e4m3fnuz-style maximum) instead of 448
    sat = np.stack([_fp8_row_scalar(row, 64, sat=240.0) for row in x])
    assert nmse(sat, good) > 1e-4
    # ties away from zero instead of to the even code, on rows full of ties
    t = A.e4m3fn_table()
    ties = np.zeros((4, 512), np.float32)
    codes = r.integers(1, 125, (4, 448))
    ties[:, :448] = (t[codes] + t[codes + 1]) / 2
    ties[:, ::64] = 448.0
    away = ties.copy()
    for i in range(4):
        for j in range(448):
            if j % 64:
                away[i, j] = t[codes[i, j] + 1]
    g = A.dsv4_fp8_kv_quantize(ties, 4, 512, 64)
    assert (g != away).mean() > 0.2  # about half the ties go the other way: never bit-exact
    # no 1e-4 floor: blocks of ~1e-10 keep full FP8 precision instead of landing on subnormal codes
    tiny = (r.standard_normal((2, 512)) * 1e-10).astype(np.float32)
    nofloor = np.stack([_fp8_row_scalar(row, 64, floor=None) for row in tiny])
    assert nmse(nofloor, A.dsv4_fp8_kv_quantize(tiny, 2, 512, 64)) > 1e-4


def _hadamard_matrix(n=128):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_hadamard_butterfly_equals_the_sylvester_matrix():
    x = rng(3).standard_normal((5, 128)).astype(np.float32)
    got = A.hadamard128_f32(x)
    want = x.astype(np.float64) @ _hadamard_matrix().T / math.sqrt(128)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_indexer_qat_matches_scalar_fp4_and_a_missing_scale_is_far_off():
    x = rng(4).standard_normal((64, 128)).astype(np.float32)
    got = A.dsv4_indexer_qat(x, 64, 128)
    h = A.hadamard128_f32(x)
    for i in range(64):
        for off in range(0, 128, 32):
            blk = h[i, off:off + 32]
            amax = max(float(np.abs(blk).max()), 7.052966104933725e-38)
            scale = 2.0 ** math.ceil(math.log2(np.float32(np.float32(amax) / np.float32(6.0))))
            want = [_round_float(max(-6.0, min(6.0, float(v) / scale)), 1, 0, 6.0) * scale for v in blk]
            np.testing.assert_array_equal(got[i, off:off + 32], np.array(want, np.float32))
    # every output is an E2M1 value times a power of two (exact in f16, what the WMMA paths rely on)
    assert np.array_equal(got.astype(np.float16).astype(np.float32), got)
    # the transform without its 1/sqrt(128): the scales absorb it? no -- FP4 blocks are scale-free,
    # so the QAT output is just sqrt(128) larger
    unscaled = A.fp4_act_quantize(A.hadamard128_f32(x) / A.HADAMARD_SCALE)
    assert nmse(unscaled, got) > 1.0
    # FP4 ties go to the even code: 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4
    np.testing.assert_array_equal(A.e2m1_round(np.array([0.25, 0.75, 2.5, 5.0, -1.25], np.float32)),
                                  [0.0, 1.0, 2.0, 4.0, -1.0])


# ---------------------------------------------------------------------------
# raw KV ring
# ---------------------------------------------------------------------------

def _f16_scalar(v):
    return struct.unpack("<e", struct.pack("<e", float(v)))[0]


def test_raw_ring_store_matches_a_scalar_loop_and_the_ring_wraps():
    r = rng(5)
    cache = A.f16_round(r.standard_normal((7, 33)))
    kv = r.standard_normal((5, 33)).astype(np.float32)
    got = A.store_raw_kv_batch(cache, kv, 7, 5, 5, 33)
    want = cache.copy()
    for t in range(5):
        want[(5 + t) % 7] = [_f16_scalar(v) for v in kv[t]]
    np.testing.assert_array_equal(got, want)
    # rows 5, 6, 0, 1, 2 written; 3 and 4 untouched
    assert np.array_equal(got[3:5], cache[3:5])
    # a store that skips the f16 rounding is not bit-exact
    raw = cache.copy()
    raw[[5, 6, 0, 1, 2]] = kv
    assert not np.array_equal(raw, got)
    kq, ring = A.kv_fp8_store_raw(r.standard_normal(512).astype(np.float32),
                                  A.f16_round(r.standard_normal((4, 512))), 4, 9, 512, 64)
    np.testing.assert_array_equal(ring[1], A.f16_round(kq))  # position 9 -> ring row 1, after the FP8 trip


# ---------------------------------------------------------------------------
# indexer scores
# ---------------------------------------------------------------------------

def _indexer_scalar(q, w, k, pos0, ratio, scale, causal):
    n_t, n_h, _ = q.shape
    out = np.zeros((n_t, k.shape[0]))
    for t in range(n_t):
        for c in range(k.shape[0]):
            if causal and c >= (pos0 + t + 1) // ratio:
                out[t, c] = -math.inf
                continue
            out[t, c] = scale * math.fsum(max(0.0, math.fsum(map(float, q[t, h] * k[c].astype(np.float64)))) *
                                          float(w[t, h]) for h in range(n_h))
    return out


def test_indexer_scores_match_a_scalar_loop_and_wrong_variants_fail_the_spec():
    r = rng(6)
    q = A.dsv4_indexer_qat(r.standard_normal((5 * 4, 128)).astype(np.float32), 20, 128).reshape(5, 4, 128)
    w = r.standard_normal((5, 4)).astype(np.float32)
    k = A.dsv4_indexer_qat(r.standard_normal((9, 128)).astype(np.float32), 9, 128)
    scale = float(np.float32(1 / math.sqrt(512)))
    got = A.indexer_scores_decode_batch(q, w, k, 9, 5, 30, 4, 128, 4, scale)
    want = _indexer_scalar(q, w, k, 30, 4, scale, True)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6, atol=1e-7)
    assert not violations(got, want, INDEXER_TOL)
    # relu dropped
    norelu = scale * np.einsum("thd,cd,th->tc", q.astype(np.float64), k.astype(np.float64), w)
    norelu[np.isinf(want)] = -np.inf
    assert violations(norelu, want, INDEXER_TOL)
    # causal cut off by one: (pos + t) // ratio rows visible
    off1 = _indexer_scalar(q, w, k, 29, 4, scale, True)
    assert violations(off1, want, INDEXER_TOL)
    # the spec's max|err| is what catches a finite error where the reference holds -inf:
    # NMSE and the RMS bound are blind then (the RMS is infinite)
    nudged = want.copy()
    nudged[np.isfinite(nudged)] += 1e-3
    why = violations(nudged, want, INDEXER_TOL)
    assert len(why) == 1 and why[0].startswith("max |err|")


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

def _attend_lse(q_heads, rows, sinks, bias):
    """Softmax by log-sum-exp over [sink, scores]: weights exp(s - lse), the sink's dropped."""
    out = np.zeros_like(q_heads, dtype=np.float64)
    for h in range(q_heads.shape[0]):
        s = [float(np.dot(q_heads[h].astype(np.float64), rows[i])) / math.sqrt(q_heads.shape[1]) + bias[i]
             for i in range(rows.shape[0])]
        lse = np.logaddexp.reduce(np.array([sinks[h]] + s))
        for i, si in enumerate(s):
            if si != -math.inf:
                out[h] += math.exp(si - lse) * rows[i]
    return out


def _decode_loop(q, ring, raw_start, raw_cap, n_raw, comp, mask, pos0, window, ratio, sinks, sel=None, early=0):
    """Token by token, row lists built by positions (the spec's contract, written out again)."""
    n_t = q.shape[0]
    first = pos0 + n_t - n_raw
    out = []
    for t in range(n_t):
        p = pos0 + t
        rows, bias = [], []
        for i in range(n_raw):
            pos_i = first + i
            if pos_i <= p and (window == 0 or p - pos_i < window):
                rows.append(ring[(raw_start + i) % raw_cap])
                bias.append(0.0)
        vis = min(comp.shape[0], (p + 1) // ratio + early) if ratio else comp.shape[0]
        for c in range(vis):
            if sel is not None and c not in set(sel[t].tolist()):
                continue
            add = 0.0 if mask is None else float(mask[t, c])
            rows.append(comp[c])
            bias.append(add)
        out.append(_attend_lse(q[t], np.array(rows, np.float64), sinks, bias))
    return np.array(out)


def _case(r, n_t, n_head, hd, raw_cap, n_comp):
    q = A.f16_round(r.standard_normal((n_t, n_head, hd)) * 1.5)
    ring = A.f16_round(r.standard_normal((raw_cap, hd)))
    comp = A.f16_round(r.standard_normal((max(n_comp, 1), hd)))
    sinks = r.uniform(-2, 4, n_head).astype(np.float32)
    return q, ring, comp, sinks, np.frombuffer(sinks.tobytes(), np.uint8)


def test_attention_decode_batch_matches_a_logsumexp_loop():
    r = rng(7)
    q, ring, comp, sinks, m = _case(r, 5, 3, 16, 9, 12)
    mask = np.where(r.random((5, 12)) < 0.5, -np.inf, 0.0).astype(np.float32)
    got = A.attention_decode_mixed_batch_heads(m, 0, q, ring, comp, mask, 1, 5, 30, 8, 9, 6, 12, 4, 3, 3, 16)
    want = _decode_loop(q, ring, 6, 9, 8, comp, mask, 30, 4, 3, sinks)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # single-token decode (ratio 0): every raw row and every compressed row
    got1 = A.attention_decode_heads(m, 0, q[0], ring, 9, 9, 4, comp, 12, mask[0], 1, 3, 16)
    want1 = _decode_loop(q[:1], ring, 4, 9, 9, comp, mask[:1], 0, 0, 0, sinks)[0]
    np.testing.assert_allclose(got1, want1, rtol=1e-5, atol=1e-6)
    # indexed: the selection as a set, rows not yet visible skipped
    sel = np.stack([r.permutation(12)[:6] for _ in range(5)]).astype(np.int32)
    goti = A.attention_indexed_mixed_batch_heads(m, 0, q, ring, comp, sel, 5, 30, 8, 9, 6, 12, 6, 4, 3, 3, 16)
    wanti = _decode_loop(q, ring, 6, 9, 8, comp, None, 30, 4, 3, sinks, sel=sel)
    np.testing.assert_allclose(goti, wanti, rtol=1e-5, atol=1e-6)
    # prefill: raw rows are the prompt itself
    raw = ring[:7]
    gotp = A.attention_prefill_static_mixed_heads(m, 0, q[:, :, :].repeat(2, axis=0)[:7], raw, comp, 7, 12, 3, 2,
                                                  3, 16)
    wantp = _decode_loop(q.repeat(2, axis=0)[:7], raw, 0, 7, 7, comp, None, 0, 3, 2, sinks)
    np.testing.assert_allclose(gotp, wantp, rtol=1e-5, atol=1e-6)


def test_attention_wrong_variants_are_far_outside_the_spec_tolerance():
    """At ds4's sizes: 64 heads x 512, ring of 128 (wrapped), window 128, ratio 4."""
    r = rng(8)
    q, ring, comp, sinks, m = _case(r, 3, 64, 512, 129, 300)

    def mixed(**kw):
        a = dict(model_map=m, sinks_offset=0, q=q, raw_kv=ring, comp_kv=comp, comp_mask=None, use_comp_mask=0,
                 n_tokens=3, pos0=1000, n_raw=128, raw_cap=128, raw_start=40, n_comp=300, window=128, ratio=4,
                 n_head=64, head_dim=512)
        a.update(kw)
        return A.attention_decode_mixed_batch_heads(**a)

    good = mixed()
    assert not violations(good, _decode_loop(q, ring, 40, 128, 128, comp, None, 1000, 128, 4, sinks), ATTN_TOL)
    # sinks ignored (a sink of -inf weighs nothing)
    nosink = mixed(model_map=np.frombuffer(np.full(64, -np.inf, np.float32).tobytes(), np.uint8))
    assert nmse(nosink, good) > 100 * ATTN_TOL["nmse"]
    # window off by one: a ring of 129 live rows, of which the window must show 128
    w128 = mixed(n_raw=129, raw_cap=129, raw_start=0)
    w129 = mixed(n_raw=129, raw_cap=129, raw_start=0, window=129)
    assert nmse(w129, w128) > 10 * ATTN_TOL["nmse"]
    # ring start ignored (logical row i read from ring row i)
    assert nmse(mixed(raw_start=0), good) > 100 * ATTN_TOL["nmse"]
    # compressed rows visible one window early: (pos + 1) // ratio + 1 rows
    early = _decode_loop(q, ring, 40, 128, 128, comp, None, 1000, 128, 4, sinks, early=1)
    assert nmse(early, good) > 10 * ATTN_TOL["nmse"]
    # the prefill window off by one (129 rows instead of 128 for the last tokens)
    qp = A.f16_round(r.standard_normal((129, 64, 512)) * 1.5)
    raw = ring[:129]
    p_good = A.attention_prefill_raw_heads(m, 0, qp, raw, 129, 128, 64, 512)
    p_off = A.attention_prefill_raw_heads(m, 0, qp, raw, 129, 129, 64, 512)
    assert nmse(p_off[128:], p_good[128:]) > 10 * ATTN_TOL["nmse"]
    assert np.array_equal(p_off[:128], p_good[:128])  # below the window nothing changes


def test_chunked_attention_matches_one_token_at_a_time():
    """The reference's chunked score matrix vs chunks of one token (no shared rows)."""
    r = rng(9)
    q, ring, comp, sinks, m = _case(r, 40, 4, 32, 64, 20)
    a = A.attention_decode_batch(m, 0, q, ring, comp, None, 0, 40, 100, 60, 64, 7, 20, 16, 4, 4, 32)
    b = A.attention_decode_batch(m, 0, q, ring, comp, None, 0, 40, 100, 60, 64, 7, 20, 16, 4, 4, 32, chunk=1)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # float32 products: BLAS order differs


# ---------------------------------------------------------------------------
# compressor
# ---------------------------------------------------------------------------

YARN = dict(n_ctx_orig=65536, freq_base=160000.0, freq_scale=1 / 16, ext_factor=1.0,
            attn_factor=1 / (1 + 0.1 * math.log(16)), beta_fast=32.0, beta_slow=1.0)
ROPE = tuple(YARN[k] for k in ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow"))


def _compressor_map(r, width, ratio, hd):
    ape = (r.standard_normal((ratio, width)) * 0.7).astype(np.float16)
    norm = r.uniform(0.5, 1.5, hd).astype(np.float32)
    m = np.concatenate([np.frombuffer(ape.tobytes(), np.uint8), np.frombuffer(norm.tobytes(), np.uint8)])
    return m, ape.astype(np.float32), norm.astype(np.float64), ape.nbytes


def _windows_direct(kv, sc, ape, norm, hd, ratio, pos0, n_rot, overlap=True, rope_at_end=False):
    """Window by window (the batched formulation): row c pools tokens [c*ratio, (c+1)*ratio)
    -- on ratio 4 with the previous window's first half -- with APE by each token's phase."""
    n = kv.shape[0]
    rows = []
    for c in range(n // ratio):
        cand_v, cand_s = [], []
        if ratio == 4 and c > 0 and overlap:
            for t in range((c - 1) * 4, c * 4):
                cand_v.append(kv[t, :hd])
                cand_s.append(sc[t, :hd] + ape[(pos0 + t) % 4, :hd])
        lo = hd if ratio == 4 else 0
        for t in range(c * ratio, (c + 1) * ratio):
            cand_v.append(kv[t, lo:lo + hd])
            cand_s.append(sc[t, lo:lo + hd] + ape[(pos0 + t) % ratio, lo:lo + hd])
        v, s = np.array(cand_v, np.float64), np.array(cand_s, np.float32).astype(np.float64)
        w = np.exp(s - s.max(axis=0))
        pooled = (w * v).sum(axis=0) / w.sum(axis=0)
        x = pooled / math.sqrt(np.mean(pooled ** 2) + float(np.float32(1e-6))) * norm
        pos = pos0 + c * ratio + (ratio - 1 if rope_at_end else 0)
        rows.append(base.rope_tail(x.astype(np.float32), 1, 1, hd, n_rot, pos, YARN["n_ctx_orig"], False, *ROPE)[0, 0])
    return np.array(rows, np.float32)


@pytest.mark.parametrize("ratio,n", [(4, 37), (128, 300)])
def test_compressor_prefill_streaming_equals_window_by_window(ratio, n):
    r = rng(10 + ratio)
    hd = 64 if ratio == 4 else 32
    width = (2 if ratio == 4 else 1) * hd
    m, ape, norm, n_off = _compressor_map(r, width, ratio, hd)
    kv = r.standard_normal((n, width)).astype(np.float32)
    sc = (r.standard_normal((n, width)) * 2).astype(np.float32)
    states = (np.zeros((2 * ratio if ratio == 4 else ratio, width), np.float32),) * 2
    cache = np.zeros((n // ratio + 1, hd), np.float32)
    got, skv, ssc = A.compressor_prefill(cache, *states, kv, sc, m, 0, 1, n_off, 0, hd, ratio, 0, n, 16,
                                         YARN["n_ctx_orig"], False, *ROPE, 1e-6)
    want = _windows_direct(kv, sc, ape, norm, hd, ratio, 0, 16)
    assert not violations(got[: n // ratio], want, ROW_TOL)
    np.testing.assert_allclose(got[: n // ratio], want, rtol=2e-5, atol=2e-5)
    # the state left for decode
    rem = n % ratio
    cut = n - rem
    if ratio == 4:
        np.testing.assert_array_equal(skv[:4], kv[cut - 4:cut])
        np.testing.assert_array_equal(skv[4:4 + rem], kv[cut:])
        assert np.all(ssc[4 + rem:] == -np.inf) and np.all(skv[4 + rem:] == 0)
        np.testing.assert_array_equal(ssc[4], (sc[cut] + ape[cut % 4]).astype(np.float32))
    else:
        np.testing.assert_array_equal(skv[:rem], kv[cut:])
        assert np.all(ssc[rem:] == -np.inf)
    if ratio == 4:  # the wrong variants: overlap dropped, RoPE at the window's last position
        assert nmse(_windows_direct(kv, sc, ape, norm, hd, ratio, 0, 16, overlap=False), want) > 100 * ROW_TOL["nmse"]
    late = _windows_direct(kv, sc, ape, norm, hd, ratio, 0, 16, rope_at_end=True)
    assert violations(late, want, ROW_TOL)


def test_compressor_update_token_by_token_reproduces_prefill_and_replay():
    r = rng(12)
    hd, width = 64, 128
    m, ape, norm, n_off = _compressor_map(r, width, 4, hd)
    kv = r.standard_normal((24, width)).astype(np.float32)
    sc = (r.standard_normal((24, width)) * 2).astype(np.float32)
    skv = np.zeros((8, width), np.float32)
    ssc = np.full((8, width), -np.inf, np.float32)
    cache = np.zeros((6, hd), np.float32)
    for t in range(24):
        skv, ssc, cache = A.compressor_update(kv[t], sc[t], skv, ssc, cache, m, 0, 1, n_off, 0, hd, 4, t,
                                              (t + 1) // 4 - 1 if (t + 1) % 4 == 0 else 0, 16,
                                              YARN["n_ctx_orig"], *ROPE, 1e-6)
    pre, _, _ = A.compressor_prefill(np.zeros((6, hd), np.float32), skv, ssc, kv, sc, m, 0, 1, n_off, 0, hd, 4, 0,
                                     24, 16, YARN["n_ctx_orig"], False, *ROPE, 1e-6)
    np.testing.assert_array_equal(cache, pre)
    # replay: the first 8 tokens as a fresh prefill, the next 16 as a continuing chunk
    c1, s1kv, s1sc = A.compressor_prefill(np.zeros((2, hd), np.float32), skv, ssc, kv[:8], sc[:8], m, 0, 1, n_off,
                                          0, hd, 4, 0, 8, 16, YARN["n_ctx_orig"], False, *ROPE, 1e-6)
    c2, _, _ = A.compressor_prefill_ratio4_replay(np.zeros((4, hd), np.float32), s1kv, s1sc, kv[8:], sc[8:], m, 0,
                                                  1, n_off, 0, hd, 8, 16, 16, YARN["n_ctx_orig"], False, *ROPE, 1e-6)
    np.testing.assert_array_equal(np.concatenate([c1, c2]), pre)
    # a continuing chunk that starts from an empty previous half gets its row 0 wrong
    empty = (np.zeros_like(s1kv), np.full_like(s1sc, -np.inf))
    c2e, _, _ = A.compressor_prefill_ratio4_replay(np.zeros((4, hd), np.float32), *empty, kv[8:], sc[8:], m, 0, 1,
                                                   n_off, 0, hd, 8, 16, 16, YARN["n_ctx_orig"], False, *ROPE, 1e-6)
    assert violations(c2e, c2, ROW_TOL)
    # prefill_state_ratio4 rebuilds the state a prefill ending on a window boundary leaves
    skv4, ssc4 = A.compressor_prefill_state_ratio4(None, None, kv[4:8], sc[4:8], m, 0, 1, hd, 4)
    np.testing.assert_array_equal(skv4, s1kv)
    np.testing.assert_array_equal(ssc4, s1sc)


def test_compressor_store_uses_the_phase_of_each_position():
    r = rng(13)
    hd, width = 8, 16
    m, ape, _, _ = _compressor_map(r, width, 4, hd)
    kv = r.standard_normal((2, width)).astype(np.float32)
    sc = r.standard_normal((2, width)).astype(np.float32)
    skv, ssc = A.compressor_store_batch(kv, sc, np.zeros((8, width)), np.zeros((8, width)), m, 0, 1, hd, 4, 6, 2)
    np.testing.assert_array_equal(skv[6:8], kv)                     # positions 6, 7 -> rows 4 + 2, 4 + 3
    np.testing.assert_array_equal(ssc[6], (sc[0] + ape[2]).astype(np.float32))
    np.testing.assert_array_equal(ssc[7], (sc[1] + ape[3]).astype(np.float32))
    assert np.all(skv[:6] == 0)
