"""reference.quant: gguf-py's decoders against our independent formulation.

For every quant type the engine family uses (Q8_0, Q2_K, IQ2_XXS, Q4_K, plus
F16/F32) on random valid blocks:
  * gguf-py dequantize == our blockwise decoder (float64 ours vs float32
    gguf-py: agreement to float32 rounding, rel 1e-6);
  * blockwise matvec (scale factored out of integer-code dot products, the way
    kernels compute) == dequantize-then-float64-matmul (rel 1e-12: both are
    float64 over identical values, only summation order differs);
and the same checks FAIL, by orders of magnitude, on corrupted formulations
(IQ2_XXS bytes read as Q8_0, a dropped IQ2 sign parity bit, swapped Q2_K
nibbles, a wrong Q2_K shift order, a wrong Q4_K 6-bit scale unpack).
"""
from __future__ import annotations

import numpy as np
import pytest

import gguf
import reference.quant as rq
from reference.quant import QT

QUANTS = [QT.Q8_0, QT.Q2_K, QT.IQ2_XXS, QT.Q4_K]
ALL = QUANTS + [QT.F16, QT.F32]
SEEDS = [0, 1234]


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def nmse(a, b) -> float:
    """Normalised mean squared error; inf when ``a`` has non-finite values."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-300))


# ---------------------------------------------------------------------------
# Sizes and argument handling
# ---------------------------------------------------------------------------

def test_block_sizes_match_ggml_layouts():
    assert [rq.block_bytes(q) for q in ("Q8_0", "Q2_K", "Q4_K", "IQ2_XXS", "F16", "F32")] == [34, 84, 144, 66, 2, 4]
    assert [rq.block_elems(q) for q in ("q8_0", "q2_k", "q4_k", "iq2_xxs", "f16", "f32")] == [32, 256, 256, 256, 1, 1]
    assert rq.row_bytes(QT.Q8_0, 256) == 272
    assert rq.row_bytes(QT.IQ2_XXS, 512) == 132
    assert rq.row_bytes(int(QT.Q2_K), 256) == 84
    assert rq.tensor_bytes(QT.IQ2_XXS, (8, 256, 256)) == 8 * 256 * 66
    with pytest.raises(ValueError):
        rq.row_bytes(QT.Q2_K, 128)
    with pytest.raises(NotImplementedError):
        rq.block_bytes(QT.Q5_K)
    with pytest.raises(ValueError):
        rq.dequantize(b"\0" * 33, QT.Q8_0, (1, 32))   # one byte short


def test_our_iq2xxs_grid_equals_gguf_py_packed_grid():
    # gguf-py stores the grid as 2-bit codes in hex; we store ggml's uint64 words.
    gguf.quants.IQ2_XXS.init_grid()
    theirs = np.asarray(gguf.quants.IQ2_XXS.grid).reshape(256, 8)
    assert np.array_equal(theirs, rq.IQ2XXS_GRID.astype(np.float32))
    assert set(np.unique(rq.IQ2XXS_GRID)) == {8, 25, 43}


def test_computed_sign_parity_equals_ggml_ksigns_table():
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    signs = rq._iq2_signs(np.arange(128))
    neg_bits = ((signs < 0) * (1 << np.arange(8))).sum(axis=1)
    assert np.array_equal(neg_bits, ksigns)


# ---------------------------------------------------------------------------
# Hand-made blocks (values computed by hand from the format definitions)
# ---------------------------------------------------------------------------

def test_hand_block_q8_0():
    blk = np.float16(0.5).tobytes() + np.arange(-16, 16, dtype=np.int8).tobytes()
    want = 0.5 * np.arange(-16, 16)
    for dec in (rq.dequantize, rq.dequantize_independent):
        assert np.array_equal(dec(blk, "Q8_0", (32,)), want)


def test_hand_block_q2_k():
    # every sub-block: scale 2, min 1; every qs byte 0b11_10_01_00 -> q = shift index j
    blk = bytes([0x12] * 16) + bytes([0b11100100] * 64) + np.float16(1).tobytes() + np.float16(1).tobytes()
    e = np.arange(256)
    want = 2.0 * ((e % 128) // 32) - 1.0
    for dec in (rq.dequantize, rq.dequantize_independent):
        assert np.array_equal(dec(blk, "Q2_K", (256,)), want)


def test_hand_block_iq2_xxs():
    # d = 1, group 0: grid index 0 (all 8s) for all four octets, sign index 1 on
    # octet 0 (ksigns[1] = 0b10000001: values 0 and 7 negative), scale nibble 3.
    # db = 1 * (0.5 + 3) * 0.25 = 0.875.  Other groups: index 0, no signs, scale 0.
    aux = np.zeros((8, 2), dtype="<u4")
    aux[0, 1] = 1 | (3 << 28)
    blk = np.float16(1).tobytes() + aux.tobytes()
    want = np.full(256, 0.125 * 8)
    want[:32] = 0.875 * 8
    want[[0, 7]] *= -1
    for dec in (rq.dequantize, rq.dequantize_independent):
        assert np.array_equal(dec(blk, "IQ2_XXS", (256,)), want)


def test_hand_block_q4_k():
    # sc_j = j + 1, m_j = 2 for the 8 sub-blocks; all nibbles 5 (low) and 9 (high).
    sc = np.arange(1, 9)
    mn = np.full(8, 2)
    s = np.zeros(12, dtype=np.int64)
    s[:4] = sc[:4]
    s[4:8] = mn[:4]
    s[8:12] = (sc[4:] & 0xF) | ((mn[4:] & 0xF) << 4)   # all < 16: no high bits
    blk = np.float16(0.5).tobytes() + np.float16(0.25).tobytes() + s.astype(np.uint8).tobytes() + bytes([0x95] * 128)
    e = np.arange(256)
    j = e // 32
    q = np.where((e % 64) < 32, 5, 9)
    want = 0.5 * sc[j] * q - 0.25 * mn[j]
    for dec in (rq.dequantize, rq.dequantize_independent):
        assert np.array_equal(dec(blk, "Q4_K", (256,)), want)


# ---------------------------------------------------------------------------
# gguf-py vs ours on random valid blocks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("qt", ALL, ids=lambda q: q.name)
def test_gguf_dequant_equals_independent_decoder(qt, seed):
    rng = np.random.default_rng(seed)
    n_rows, n_cols = 7, 512
    raw = rq.random_blocks(qt, n_rows, n_cols, rng)
    assert raw.shape == (n_rows, rq.row_bytes(qt, n_cols)) and raw.dtype == np.uint8
    a = rq.dequantize(raw, qt, (n_rows, n_cols))
    b = rq.dequantize_independent(raw.tobytes(), qt, (n_rows, n_cols))
    assert a.dtype == np.float32 and a.shape == (n_rows, n_cols)
    assert np.all(np.isfinite(a))
    err = rel_err(b, a)
    print(f"{qt.name}: gguf-py vs independent decoder rel err {err:.2e}")
    assert err <= 1e-6


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("qt", ALL, ids=lambda q: q.name)
def test_blockwise_matvec_equals_dequant_matmul(qt, seed):
    rng = np.random.default_rng(seed + 7)
    out_dim, in_dim = 9, 768
    raw = rq.random_blocks(qt, out_dim, in_dim, rng)
    for x in (rng.standard_normal(in_dim), rng.standard_normal((3, in_dim))):
        y1 = rq.quant_matvec(raw, qt, out_dim, in_dim, x)
        y2 = rq.quant_matvec_blockwise(raw, qt, out_dim, in_dim, x)
        assert y1.shape == y2.shape == x.shape[:-1] + (out_dim,)
        err = rel_err(y2, y1)
        print(f"{qt.name}: blockwise vs dequant-matmul rel err {err:.2e}")
        assert err <= 1e-12


@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: q.name)
def test_random_blocks_have_sane_statistics(qt):
    rng = np.random.default_rng(5)
    for scale in (1 / 16, 1.0):
        raw = rq.random_blocks(qt, 64, 256, rng, scale=scale)
        v = rq.dequantize(raw, qt, (64, 256)).astype(np.float64)
        assert scale / 2 < v.std() < scale * 2
        assert abs(v.mean()) < 0.2 * scale
        # whole code ranges in use
    if qt == QT.IQ2_XXS:
        blocks = raw.reshape(-1).view(rq._DT_IQ2_XXS)
        aux0 = blocks["aux"][:, :, 0]
        idx = np.concatenate([(aux0 >> (8 * l)) & 0xFF for l in range(4)]).ravel()
        assert len(np.unique(idx)) == 256
        assert len(np.unique(blocks["aux"][:, :, 1] >> 28)) == 16


def test_random_blocks_deterministic_per_rng_seed():
    for qt in QUANTS:
        a = rq.random_blocks(qt, 4, 256, np.random.default_rng(3))
        b = rq.random_blocks(qt, 4, 256, np.random.default_rng(3))
        c = rq.random_blocks(qt, 4, 256, np.random.default_rng(4))
        assert a.tobytes() == b.tobytes() != c.tobytes()


# ---------------------------------------------------------------------------
# The cross-check catches wrong formulations
# ---------------------------------------------------------------------------

def test_iq2_xxs_bytes_read_as_q8_0_mismatch():
    # 17 IQ2_XXS blocks (17*66 = 1122 bytes) are exactly 33 Q8_0 blocks (33*34).
    rng = np.random.default_rng(11)
    raw = rq.random_blocks(QT.IQ2_XXS, 1, 17 * 256, rng)
    right = rq.dequantize(raw, QT.IQ2_XXS, (17 * 256,))[: 33 * 32]
    with np.errstate(invalid="ignore", over="ignore"):
        wrong = rq.dequantize(raw, QT.Q8_0, (33 * 32,))   # random f16 "scales" may be inf/nan
    err = nmse(wrong, right)
    print(f"IQ2_XXS read as Q8_0: nmse {err:.3g}")
    assert err > 0.5


def _mismatch(qt, patch) -> float:
    """rel err of the independent decoder/matvec against gguf-py after ``patch()``
    corrupts our formulation (the unpatched formulation must agree first)."""
    rng = np.random.default_rng(21)
    raw = rq.random_blocks(qt, 8, 512, rng)
    good = rq.dequantize(raw, qt, (8, 512))
    x = rng.standard_normal(512)
    good_mv = rq.quant_matvec(raw, qt, 8, 512, x)
    assert rel_err(rq.dequantize_independent(raw, qt, (8, 512)), good) <= 1e-6
    patch()
    bad = rq.dequantize_independent(raw, qt, (8, 512))
    bad_mv = rq.quant_matvec_blockwise(raw, qt, 8, 512, x)
    return min(rel_err(bad, good), rel_err(bad_mv, good_mv))


def test_corrupted_formulations_are_caught(monkeypatch):
    def signs_without_parity(sign7):
        bits = (np.asarray(sign7, dtype=np.int64)[..., None] >> np.arange(8)) & 1
        bits[..., 7] = 0
        return 1 - 2 * bits

    def q4k_wrong_high_scales(scales):
        q = scales.astype(np.int64)
        sc = np.concatenate([q[..., 0:4] & 63, q[..., 8:12] & 0xF], axis=-1)     # high bits dropped
        mn = np.concatenate([q[..., 4:8] & 63, q[..., 8:12] >> 4], axis=-1)
        return sc, mn

    q8_unsigned = np.dtype([("d", "<f2"), ("qs", "u1", (32,))])                 # int8 codes read unsigned
    cases = [
        (QT.IQ2_XXS, "IQ2 sign parity dropped", lambda mp: mp.setattr(rq, "_iq2_signs", signs_without_parity)),
        (QT.Q2_K, "Q2_K shift order reversed", lambda mp: mp.setattr(rq, "_Q2K_SHIFT", rq._Q2K_SHIFT[::-1].copy())),
        (QT.Q4_K, "Q4_K high scale bits dropped", lambda mp: mp.setattr(rq, "_q4k_scale_min", q4k_wrong_high_scales)),
        (QT.Q8_0, "Q8_0 codes unsigned", lambda mp: mp.setitem(rq._DTYPES, QT.Q8_0, q8_unsigned)),
    ]
    for qt, what, patch in cases:
        with monkeypatch.context() as mp:
            err = _mismatch(qt, lambda: patch(mp))
        print(f"{qt.name}, {what}: rel err {err:.3g}")
        assert err > 1e-2, (qt, what, err)


def test_corrupted_q2_k_nibble_swap_is_caught():
    rng = np.random.default_rng(8)
    raw = rq.random_blocks(QT.Q2_K, 4, 256, rng)
    swapped = raw.copy()
    sc = swapped[:, 0:16]
    swapped[:, 0:16] = ((sc & 0xF) << 4) | (sc >> 4)       # scale <-> min
    err = rel_err(rq.dequantize_independent(swapped, QT.Q2_K, (4, 256)), rq.dequantize(raw, QT.Q2_K, (4, 256)))
    assert err > 1e-1
