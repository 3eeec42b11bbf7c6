"""GGUF quant block formats: dequantizers, sizes, matvecs and random valid blocks.

Two formulations live here on purpose:

* ``dequantize`` goes THROUGH gguf-py (``gguf.quants.dequantize``), the
  official Python port of ggml's block decoders.  Everything that needs "the
  true values of these weight bytes" (the op references, the parity gate)
  uses it.
* ``dequantize_independent`` / ``quant_matvec_blockwise`` are written here from
  the block definitions in ggml-common.h / ggml-quants.c (struct layouts and
  ``dequantize_row_*``), with our own field parsing (numpy structured dtypes),
  our own copy of the IQ2_XXS grid (taken from the 64-bit table ggml and ds4
  use, not from gguf-py's 2-bit packed hex) and sign parities computed rather
  than tabled.  They exist only to cross-check gguf-py: if both agree on random
  valid blocks, neither has silently misread the format.

Shapes are written row-major as numpy sees them: ``(out_dim, in_dim)`` or
``(n_expert, out_dim, in_dim)``; quant blocks run along the last axis.
"""
from __future__ import annotations

from math import prod
from typing import Sequence, Union

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

QK_K = 256

#: Types this module supports (the fixture's mix plus the abandoned Q4_K variant).
SUPPORTED = (QT.F32, QT.F16, QT.Q8_0, QT.Q2_K, QT.Q4_K, QT.IQ2_XXS)

QTypeLike = Union[QT, str, int]
RawLike = Union[bytes, bytearray, memoryview, np.ndarray]


# ---------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------

def qtype_of(qtype: QTypeLike) -> QT:
    """Accepts a GGMLQuantizationType, its name ("Q8_0", "iq2_xxs") or its number."""
    if isinstance(qtype, QT):
        qt = qtype
    elif isinstance(qtype, str):
        try:
            qt = QT[qtype.upper()]
        except KeyError:
            raise ValueError(f"unknown GGML type name {qtype!r}") from None
    elif isinstance(qtype, (int, np.integer)):
        qt = QT(int(qtype))
    else:
        raise TypeError(f"not a GGML type: {qtype!r}")
    if qt not in SUPPORTED:
        raise NotImplementedError(f"{qt.name} is not supported by reference.quant")
    return qt


def block_elems(qtype: QTypeLike) -> int:
    """Values per block (32 for Q8_0, 256 for the K/IQ types, 1 for F16/F32)."""
    return GGML_QUANT_SIZES[qtype_of(qtype)][0]


def block_bytes(qtype: QTypeLike) -> int:
    """Bytes per block (Q8_0 34, Q2_K 84, Q4_K 144, IQ2_XXS 66, F16 2, F32 4)."""
    return GGML_QUANT_SIZES[qtype_of(qtype)][1]


def row_bytes(qtype: QTypeLike, n: int) -> int:
    """Bytes of one row of n values; n must be a multiple of the block size."""
    be, bb = GGML_QUANT_SIZES[qtype_of(qtype)]
    if n % be:
        raise ValueError(f"row of {n} values is not a multiple of the {qtype_of(qtype).name} block ({be})")
    return n // be * bb


def tensor_bytes(qtype: QTypeLike, shape: Sequence[int]) -> int:
    """Bytes of a tensor of the given row-major element shape."""
    shape = tuple(int(s) for s in shape)
    return prod(shape[:-1]) * row_bytes(qtype, shape[-1])


def _as_u8(raw: RawLike, nbytes: int) -> np.ndarray:
    """raw as a flat uint8 array of exactly nbytes (a view when possible)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        u8 = np.frombuffer(raw, dtype=np.uint8)
    else:
        a = np.asarray(raw)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        u8 = a.reshape(-1).view(np.uint8)
    if u8.size != nbytes:
        raise ValueError(f"expected {nbytes} bytes of weights, got {u8.size}")
    return u8


# ---------------------------------------------------------------------------
# Through gguf-py
# ---------------------------------------------------------------------------

def dequantize(raw: RawLike, qtype: QTypeLike, shape: Sequence[int]) -> np.ndarray:
    """Weights bytes -> float32 array of ``shape``, decoded by gguf-py.

    ``raw`` holds exactly ``tensor_bytes(qtype, shape)`` bytes (bytes, or any
    numpy array whose memory is those bytes)."""
    qt = qtype_of(qtype)
    shape = tuple(int(s) for s in shape)
    u8 = _as_u8(raw, tensor_bytes(qt, shape))
    n_rows = prod(shape[:-1])
    rows = u8.reshape(n_rows, row_bytes(qt, shape[-1]))
    vals = gguf.quants.dequantize(rows, qt)
    return np.array(vals, dtype=np.float32).reshape(shape)


def quant_matvec(raw: RawLike, qtype: QTypeLike, out_dim: int, in_dim: int, x: np.ndarray) -> np.ndarray:
    """y = W x with W (out_dim x in_dim) dequantized by gguf-py, in float64.

    x is ``(in_dim,)`` -> y ``(out_dim,)``, or ``(n_tok, in_dim)`` -> ``(n_tok, out_dim)``."""
    w = dequantize(raw, qtype, (out_dim, in_dim)).astype(np.float64)
    x64 = np.asarray(x, dtype=np.float64)
    if x64.shape[-1] != in_dim:
        raise ValueError(f"x has {x64.shape[-1]} columns, W has {in_dim}")
    return x64 @ w.T


# ---------------------------------------------------------------------------
# Independent formulation (ours, from ggml's block definitions)
# ---------------------------------------------------------------------------

# block_q8_0  { ggml_half d; int8_t qs[32]; }                                   34 B
_DT_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
# block_q2_K  { uint8_t scales[16]; uint8_t qs[64]; ggml_half d; ggml_half dmin; } 84 B
#   scales[i]: low nibble scale, high nibble min of the 16-value sub-block i
_DT_Q2_K = np.dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"), ("dmin", "<f2")])
# block_q4_K  { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[128]; } 144 B
_DT_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
# block_iq2_xxs { ggml_half d; uint16_t qs[32]; }  read as 8 pairs of uint32 (aux0, aux1) 66 B
#   aux0: four grid indices (bytes), aux1: four 7-bit sign indices | 4-bit scale << 28
_DT_IQ2_XXS = np.dtype([("d", "<f2"), ("aux", "<u4", (8, 2))])

_DTYPES = {QT.Q8_0: _DT_Q8_0, QT.Q2_K: _DT_Q2_K, QT.Q4_K: _DT_Q4_K, QT.IQ2_XXS: _DT_IQ2_XXS}
for _qt, _dt in _DTYPES.items():
    assert _dt.itemsize == GGML_QUANT_SIZES[_qt][1], _qt

# iq2xxs_grid[256] from ggml-common.h (identical in ds4.c): each uint64 holds 8
# magnitudes (bytes 0x08, 0x19, 0x2b = 8, 25, 43), byte j = value j (little endian).
IQ2XXS_GRID_U64 = np.array([
    0x0808080808080808, 0x080808080808082b, 0x0808080808081919, 0x0808080808082b08,
    0x0808080808082b2b, 0x0808080808190819, 0x0808080808191908, 0x08080808082b0808,
    0x08080808082b082b, 0x08080808082b2b08, 0x08080808082b2b2b, 0x0808080819080819,
    0x0808080819081908, 0x0808080819190808, 0x0808080819192b08, 0x08080808192b0819,
    0x08080808192b1908, 0x080808082b080808, 0x080808082b08082b, 0x080808082b082b2b,
    0x080808082b2b082b, 0x0808081908080819, 0x0808081908081908, 0x0808081908190808,
    0x0808081908191919, 0x0808081919080808, 0x080808192b081908, 0x080808192b192b08,
    0x0808082b08080808, 0x0808082b0808082b, 0x0808082b082b082b, 0x0808082b2b08082b,
    0x0808190808080819, 0x0808190808081908, 0x0808190808190808, 0x08081908082b0819,
    0x08081908082b1908, 0x0808190819080808, 0x080819081908082b, 0x0808190819082b08,
    0x08081908192b0808, 0x080819082b080819, 0x080819082b081908, 0x080819082b190808,
    0x080819082b2b1908, 0x0808191908080808, 0x080819190808082b, 0x0808191908082b08,
    0x08081919082b0808, 0x080819191908192b, 0x08081919192b2b19, 0x080819192b080808,
    0x080819192b190819, 0x0808192b08082b19, 0x0808192b08190808, 0x0808192b19080808,
    0x0808192b2b081908, 0x0808192b2b2b1908, 0x08082b0808080808, 0x08082b0808081919,
    0x08082b0808082b08, 0x08082b0808191908, 0x08082b08082b2b08, 0x08082b0819080819,
    0x08082b0819081908, 0x08082b0819190808, 0x08082b081919082b, 0x08082b082b082b08,
    0x08082b1908081908, 0x08082b1919080808, 0x08082b2b0808082b, 0x08082b2b08191908,
    0x0819080808080819, 0x0819080808081908, 0x0819080808190808, 0x08190808082b0819,
    0x0819080819080808, 0x08190808192b0808, 0x081908082b081908, 0x081908082b190808,
    0x081908082b191919, 0x0819081908080808, 0x0819081908082b08, 0x08190819082b0808,
    0x0819081919190808, 0x0819081919192b2b, 0x081908192b080808, 0x0819082b082b1908,
    0x0819082b19081919, 0x0819190808080808, 0x0819190808082b08, 0x08191908082b0808,
    0x08191908082b1919, 0x0819190819082b19, 0x081919082b080808, 0x0819191908192b08,
    0x08191919192b082b, 0x0819192b08080808, 0x0819192b0819192b, 0x08192b0808080819,
    0x08192b0808081908, 0x08192b0808190808, 0x08192b0819080808, 0x08192b082b080819,
    0x08192b1908080808, 0x08192b1908081919, 0x08192b192b2b0808, 0x08192b2b19190819,
    0x082b080808080808, 0x082b08080808082b, 0x082b080808082b2b, 0x082b080819081908,
    0x082b0808192b0819, 0x082b08082b080808, 0x082b08082b08082b, 0x082b0819082b2b19,
    0x082b081919082b08, 0x082b082b08080808, 0x082b082b0808082b, 0x082b190808080819,
    0x082b190808081908, 0x082b190808190808, 0x082b190819080808, 0x082b19081919192b,
    0x082b191908080808, 0x082b191919080819, 0x082b1919192b1908, 0x082b192b2b190808,
    0x082b2b0808082b08, 0x082b2b08082b0808, 0x082b2b082b191908, 0x082b2b2b19081908,
    0x1908080808080819, 0x1908080808081908, 0x1908080808190808, 0x1908080808192b08,
    0x19080808082b0819, 0x19080808082b1908, 0x1908080819080808, 0x1908080819082b08,
    0x190808081919192b, 0x19080808192b0808, 0x190808082b080819, 0x190808082b081908,
    0x190808082b190808, 0x1908081908080808, 0x19080819082b0808, 0x19080819192b0819,
    0x190808192b080808, 0x190808192b081919, 0x1908082b08080819, 0x1908082b08190808,
    0x1908082b19082b08, 0x1908082b1919192b, 0x1908082b192b2b08, 0x1908190808080808,
    0x1908190808082b08, 0x19081908082b0808, 0x190819082b080808, 0x190819082b192b19,
    0x190819190819082b, 0x19081919082b1908, 0x1908192b08080808, 0x19082b0808080819,
    0x19082b0808081908, 0x19082b0808190808, 0x19082b0819080808, 0x19082b0819081919,
    0x19082b1908080808, 0x19082b1919192b08, 0x19082b19192b0819, 0x19082b192b08082b,
    0x19082b2b19081919, 0x19082b2b2b190808, 0x1919080808080808, 0x1919080808082b08,
    0x1919080808190819, 0x1919080808192b19, 0x19190808082b0808, 0x191908082b080808,
    0x191908082b082b08, 0x1919081908081908, 0x191908191908082b, 0x191908192b2b1908,
    0x1919082b2b190819, 0x191919082b190808, 0x191919082b19082b, 0x1919191908082b2b,
    0x1919192b08080819, 0x1919192b19191908, 0x19192b0808080808, 0x19192b0808190819,
    0x19192b0808192b19, 0x19192b08192b1908, 0x19192b1919080808, 0x19192b2b08082b08,
    0x192b080808081908, 0x192b080808190808, 0x192b080819080808, 0x192b0808192b2b08,
    0x192b081908080808, 0x192b081919191919, 0x192b082b08192b08, 0x192b082b192b0808,
    0x192b190808080808, 0x192b190808081919, 0x192b191908190808, 0x192b19190819082b,
    0x192b19192b081908, 0x192b2b081908082b, 0x2b08080808080808, 0x2b0808080808082b,
    0x2b08080808082b2b, 0x2b08080819080819, 0x2b0808082b08082b, 0x2b08081908081908,
    0x2b08081908192b08, 0x2b08081919080808, 0x2b08082b08190819, 0x2b08190808080819,
    0x2b08190808081908, 0x2b08190808190808, 0x2b08190808191919, 0x2b08190819080808,
    0x2b081908192b0808, 0x2b08191908080808, 0x2b0819191908192b, 0x2b0819192b191908,
    0x2b08192b08082b19, 0x2b08192b19080808, 0x2b08192b192b0808, 0x2b082b080808082b,
    0x2b082b1908081908, 0x2b082b2b08190819, 0x2b19080808081908, 0x2b19080808190808,
    0x2b190808082b1908, 0x2b19080819080808, 0x2b1908082b2b0819, 0x2b1908190819192b,
    0x2b1908192b080808, 0x2b19082b19081919, 0x2b19190808080808, 0x2b191908082b082b,
    0x2b19190819081908, 0x2b19191919190819, 0x2b192b082b080819, 0x2b192b19082b0808,
    0x2b2b08080808082b, 0x2b2b080819190808, 0x2b2b08082b081919, 0x2b2b081908082b19,
    0x2b2b082b08080808, 0x2b2b190808192b08, 0x2b2b2b0819190808, 0x2b2b2b1908081908,
], dtype=np.uint64)


def _iq2xxs_grid_values() -> np.ndarray:
    """(256, 8) int64 magnitudes: byte j of each grid word."""
    shifts = (8 * np.arange(8)).astype(np.uint64)
    return ((IQ2XXS_GRID_U64[:, None] >> shifts[None, :]) & np.uint64(0xFF)).astype(np.int64)


IQ2XXS_GRID = _iq2xxs_grid_values()


def _iq2_signs(sign7: np.ndarray) -> np.ndarray:
    """7 stored sign bits -> 8 signs (+1/-1).  ggml's ksigns_iq2xs table is
    ``i | (popcount(i) & 1) << 7``: the eighth sign makes the count of negatives
    even.  We compute it instead of copying the table."""
    sign7 = sign7.astype(np.int64)
    bits = (sign7[..., None] >> np.arange(7)) & 1                       # (..., 7)
    parity = bits.sum(axis=-1, keepdims=True) & 1                       # (..., 1)
    neg = np.concatenate([bits, parity], axis=-1)                       # (..., 8)
    return 1 - 2 * neg


def _q4k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7 over (n_blocks, 12) -> two (n_blocks, 8) int arrays."""
    q = scales.astype(np.int64)
    sc = np.empty(q.shape[:-1] + (8,), dtype=np.int64)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = q[..., j] & 63
            mn[..., j] = q[..., j + 4] & 63
        else:
            sc[..., j] = (q[..., j + 4] & 0xF) | ((q[..., j - 4] >> 6) << 4)
            mn[..., j] = (q[..., j + 4] >> 4) | ((q[..., j] >> 6) << 4)
    return sc, mn


# Per-element index maps inside a 256-value block, from the dequantize_row_* loops.
_E = np.arange(QK_K)
# Q2_K: 2 halves of 128 values; in a half, 4 shifts (0,2,4,6) of 32 bytes qs[32*half + l]
_Q2K_BYTE = 32 * (_E // 128) + (_E % 32)
_Q2K_SHIFT = 2 * ((_E % 128) // 32)
# Q4_K: 4 chunks of 64 values; low nibbles of qs[32*c + l] then high nibbles
_Q4K_BYTE = 32 * (_E // 64) + (_E % 32)
_Q4K_SHIFT = 4 * ((_E % 64) // 32)


def _parse(qt: QT, u8: np.ndarray) -> np.ndarray:
    return u8.view(_DTYPES[qt])


def _decode_int_parts(qt: QT, blocks: np.ndarray):
    """Split each block into integer codes and per-group float64 affine terms.

    Returns (q, scale, offset, group) with value = scale[g] * q - offset[g] where
    q is (n_blocks, block_elems) int64 and scale/offset are (n_blocks, n_groups)
    float64, group the number of values per group."""
    if qt == QT.Q8_0:
        d = blocks["d"].astype(np.float64)
        return blocks["qs"].astype(np.int64), d[:, None], np.zeros((len(blocks), 1)), 32
    if qt == QT.Q2_K:
        d = blocks["d"].astype(np.float64)[:, None]
        dmin = blocks["dmin"].astype(np.float64)[:, None]
        sc = blocks["scales"].astype(np.int64)
        q = (blocks["qs"][:, _Q2K_BYTE].astype(np.int64) >> _Q2K_SHIFT) & 3
        return q, d * (sc & 0xF), dmin * (sc >> 4), 16
    if qt == QT.Q4_K:
        d = blocks["d"].astype(np.float64)[:, None]
        dmin = blocks["dmin"].astype(np.float64)[:, None]
        sc, mn = _q4k_scale_min(blocks["scales"])
        q = (blocks["qs"][:, _Q4K_BYTE].astype(np.int64) >> _Q4K_SHIFT) & 0xF
        return q, d * sc, dmin * mn, 32
    if qt == QT.IQ2_XXS:
        d = blocks["d"].astype(np.float64)
        aux0 = blocks["aux"][:, :, 0].astype(np.int64)                 # (nb, 8)
        aux1 = blocks["aux"][:, :, 1].astype(np.int64)
        l = np.arange(4)
        gidx = (aux0[:, :, None] >> (8 * l)) & 0xFF                     # (nb, 8, 4)
        sidx = (aux1[:, :, None] >> (7 * l)) & 127                      # (nb, 8, 4)
        mag = IQ2XXS_GRID[gidx]                                         # (nb, 8, 4, 8)
        q = (mag * _iq2_signs(sidx)).reshape(len(blocks), QK_K)
        db = d[:, None] * (0.5 + (aux1 >> 28)) * 0.25                   # (nb, 8)
        return q, db, np.zeros_like(db), 32
    raise NotImplementedError(qt.name)


def dequantize_independent(raw: RawLike, qtype: QTypeLike, shape: Sequence[int]) -> np.ndarray:
    """Our own decoder (float64 arithmetic, float32 result); cross-checks ``dequantize``."""
    qt = qtype_of(qtype)
    shape = tuple(int(s) for s in shape)
    u8 = _as_u8(raw, tensor_bytes(qt, shape))
    if qt == QT.F32:
        return u8.view("<f4").astype(np.float32).reshape(shape)
    if qt == QT.F16:
        return u8.view("<f2").astype(np.float32).reshape(shape)
    blocks = _parse(qt, u8)
    q, scale, offset, group = _decode_int_parts(qt, blocks)
    nb, be = q.shape
    qg = q.reshape(nb, be // group, group).astype(np.float64)
    vals = scale[:, :, None] * qg - offset[:, :, None]
    return vals.reshape(shape).astype(np.float32)


def quant_matvec_blockwise(raw: RawLike, qtype: QTypeLike, out_dim: int, in_dim: int, x: np.ndarray) -> np.ndarray:
    """y = W x computed the way a kernel does, from our own decoder: per block
    and group, integer codes dotted with x, then scaled, minus min * sum(x):
        y[o] = sum_groups scale_g * (q_g . x_g) - offset_g * sum(x_g)
    float64 throughout.  x ``(in_dim,)`` or ``(n_tok, in_dim)``."""
    qt = qtype_of(qtype)
    x64 = np.asarray(x, dtype=np.float64)
    squeeze = x64.ndim == 1
    x2 = x64.reshape(-1, in_dim)
    u8 = _as_u8(raw, tensor_bytes(qt, (out_dim, in_dim)))
    if qt in (QT.F32, QT.F16):
        w = u8.view("<f4" if qt == QT.F32 else "<f2").astype(np.float64).reshape(out_dim, in_dim)
        y = np.einsum("oi,ti->to", w, x2)
        return y[0] if squeeze else y
    be = block_elems(qt)
    nbr = in_dim // be
    blocks = _parse(qt, u8)                                   # (out_dim * nbr,)
    q, scale, offset, group = _decode_int_parts(qt, blocks)
    ng = be // group
    qg = q.reshape(out_dim, nbr, ng, group).astype(np.float64)
    scale = scale.reshape(out_dim, nbr, ng)
    offset = offset.reshape(out_dim, nbr, ng)
    xg = x2.reshape(-1, nbr, ng, group)
    qdot = np.einsum("obgk,tbgk->tobg", qg, xg)               # integer codes . x per group
    xsum = xg.sum(axis=-1)                                    # (t, nbr, ng)
    y = (qdot * scale[None]).sum(axis=(2, 3)) - np.einsum("obg,tbg->to", offset, xsum)
    return y[0] if squeeze else y


# ---------------------------------------------------------------------------
# Random valid blocks
# ---------------------------------------------------------------------------

def _f16(v: np.ndarray) -> np.ndarray:
    h = np.asarray(v, dtype=np.float64).astype(np.float16)
    if not np.all(np.isfinite(h)) or np.any(h <= 0):
        raise ValueError("block scale does not fit a positive finite f16")
    return h


def random_blocks(qtype: QTypeLike, n_rows: int, n_cols: int, rng: np.random.Generator,
                  scale: float | None = None) -> np.ndarray:
    """``(n_rows, row_bytes)`` uint8 of valid random blocks of ``qtype``.

    The decoded values have mean about 0 and standard deviation about ``scale``
    (default ``1/sqrt(n_cols)``, so that W x keeps x's magnitude).  Block
    scales are positive finite f16 with a log-normal spread between blocks;
    every code field takes its whole range (Q8_0 codes include -128, IQ2_XXS
    uses all 256 grid points, all sign patterns and all 16 block scales)."""
    qt = qtype_of(qtype)
    n_rows, n_cols = int(n_rows), int(n_cols)
    rb = row_bytes(qt, n_cols)
    if scale is None:
        scale = 1.0 / np.sqrt(n_cols)
    scale = float(scale)
    if qt == QT.F32:
        return (rng.standard_normal((n_rows, n_cols)) * scale).astype("<f4").view(np.uint8).reshape(n_rows, rb)
    if qt == QT.F16:
        return (rng.standard_normal((n_rows, n_cols)) * scale).astype("<f2").view(np.uint8).reshape(n_rows, rb)
    nb = n_rows * (n_cols // block_elems(qt))
    jitter = np.exp(rng.normal(0.0, 0.25, nb))
    b = np.zeros(nb, dtype=_DTYPES[qt])
    if qt == QT.Q8_0:
        b["qs"] = rng.integers(-128, 128, (nb, 32))
        b["d"] = _f16(scale / 73.9 * jitter)              # std of uniform int8 ~ 73.9
    elif qt == QT.Q2_K:
        sc = rng.integers(1, 16, (nb, 16))
        mn = np.clip(sc + rng.integers(-1, 2, (nb, 16)), 0, 15)
        b["scales"] = sc | (mn << 4)
        b["qs"] = rng.integers(0, 256, (nb, 64))
        d = _f16(scale / (8.0 * 1.118) * jitter)          # E[sc] = 8, std(q in 0..3) = 1.118
        b["d"] = d
        b["dmin"] = _f16(1.5 * d.astype(np.float64))      # min = 1.5 * scale centres q - 1.5
    elif qt == QT.Q4_K:
        sc = rng.integers(1, 64, (nb, 8))
        mn = np.clip(np.rint(sc * 7.5 / 8.0).astype(np.int64) + rng.integers(-1, 2, (nb, 8)), 0, 63)
        s = np.zeros((nb, 12), dtype=np.int64)
        for j in range(8):
            if j < 4:
                s[:, j] |= sc[:, j]
                s[:, j + 4] |= mn[:, j]
            else:
                s[:, j + 4] |= (sc[:, j] & 0xF) | ((mn[:, j] & 0xF) << 4)
                s[:, j - 4] |= (sc[:, j] >> 4) << 6
                s[:, j] |= (mn[:, j] >> 4) << 6
        b["scales"] = s
        b["qs"] = rng.integers(0, 256, (nb, 128))
        d = _f16(scale / (32.0 * 4.61) * jitter)          # E[sc] = 32, std(q in 0..15) = 4.61
        b["d"] = d
        b["dmin"] = _f16(8.0 * d.astype(np.float64))      # dmin*m ~ 7.5*d*sc centres the values
    elif qt == QT.IQ2_XXS:
        aux = np.zeros((nb, 8, 2), dtype=np.uint64)
        g = rng.integers(0, 256, (nb, 8, 4)).astype(np.uint64)
        aux[:, :, 0] = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16) | (g[..., 3] << 24)
        s = rng.integers(0, 128, (nb, 8, 4)).astype(np.uint64)
        ls = rng.integers(0, 16, (nb, 8)).astype(np.uint64)
        aux[:, :, 1] = s[..., 0] | (s[..., 1] << 7) | (s[..., 2] << 14) | (s[..., 3] << 21) | (ls << 28)
        b["aux"] = aux.astype(np.uint32)
        rms_grid = float(np.sqrt(np.mean(IQ2XXS_GRID.astype(np.float64) ** 2)))
        rms_ls = float(np.sqrt(np.mean((np.arange(16) + 0.5) ** 2)))
        b["d"] = _f16(scale / (0.25 * rms_ls * rms_grid) * jitter)
    else:  # pragma: no cover
        raise NotImplementedError(qt.name)
    return b.view(np.uint8).reshape(n_rows, rb)


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """float values (..., n) -> Q8_0 bytes (..., n/32*34) through gguf-py's
    bit-exact port of ggml's quantize_row_q8_0."""
    return gguf.quants.quantize(np.asarray(values, dtype=np.float32), QT.Q8_0)
