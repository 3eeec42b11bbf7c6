"""Byte-exact descriptions of the GGML block formats a unit may read, for the prompt.

The failed port's model guessed the weight format; porter states it.  Each
description gives the C struct as it lies in the GGUF file, the value of
element e of a block, and how a row of a weight matrix is addressed.  The
decode rules are checked against gguf-py's dequantizers in
tests/test_prompt_golden.py (test_quant_layout_descriptions_decode_like_gguf).

IQ2_XXS needs two constant tables; they are rendered as CUDA __constant__
arrays from gguf-py (the format's own constants), so the model copies them
instead of recalling 256 64-bit numbers.
"""

from __future__ import annotations

import re
from functools import lru_cache

# canonical names (as GGUF / ggml spell them) -> (values per block, bytes per block)
BLOCK_SIZES = {"F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q4_K": (256, 144), "IQ2_XXS": (256, 66)}

_ALIASES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q2_k": "Q2_K", "q4_k": "Q4_K", "iq2_xxs": "IQ2_XXS"}


def canonical(qtype: str) -> str | None:
    """'q8_0', 'Q8_0', 'GGMLQuantizationType.Q8_0' -> 'Q8_0' (None if unknown)."""
    name = str(getattr(qtype, "name", qtype)).split(".")[-1]
    return _ALIASES.get(name.lower())


_ROW = """\
A weight matrix W[out_dim][in_dim] is out_dim rows; row o is in_dim/{qk} consecutive blocks
({bb} bytes each) starting at byte o * (in_dim/{qk}) * {bb} of the tensor; block b of row o holds
W[o][b*{qk} .. b*{qk}+{qk_1}].  Blocks are packed with no padding, so a block may start at any
even byte address: read multi-byte fields (half, uint16) with byte-aligned loads or memcpy-style
access, not with wider vector loads that assume 4/8/16-byte alignment."""

_F16 = """\
### F16 (1 value, 2 bytes)
IEEE-754 binary16, little-endian (`__half` in CUDA; widen with __half2float).  A matrix row o
of in_dim values starts at byte o * in_dim * 2.  Accumulate in float32."""

_F32 = """\
### F32 (1 value, 4 bytes)
IEEE-754 binary32, little-endian.  Element i of a vector starts at byte 4*i."""

_Q8_0 = """\
### Q8_0 (blocks of 32 values, 34 bytes)
```c
typedef struct {
    half   d;        // bytes 0-1: scale, IEEE binary16
    int8_t qs[32];   // bytes 2-33: signed codes
} block_q8_0;        // sizeof == 34, no padding
```
value[e] = float(d) * qs[e]   for e in 0..31  (qs ranges over the full int8 range, -128 included).
""" + _ROW.format(qk=32, bb=34, qk_1=31)

_Q4_K = """\
### Q4_K (super-blocks of 256 values, 144 bytes)
```c
typedef struct {
    half    d;            // bytes 0-1: scale of the 6-bit sub-block scales
    half    dmin;         // bytes 2-3: scale of the 6-bit sub-block mins
    uint8_t scales[12];   // bytes 4-15: 8 (scale, min) pairs, 6 bits each, packed
    uint8_t qs[128];      // bytes 16-143: 4-bit codes, two per byte
} block_q4_K;             // sizeof == 144
```
The 8 sub-blocks of 32 values have a 6-bit scale sc[j] and 6-bit min m[j] (j = 0..7):
  j < 4:  sc[j] = scales[j] & 63;  m[j] = scales[j+4] & 63
  j >= 4: sc[j] = (scales[j+4] & 0x0F) | ((scales[j-4] >> 6) << 4)
          m[j]  = (scales[j+4] >> 4)   | ((scales[j]   >> 6) << 4)
Element e (0..255): c = e / 64 (chunk), r = e % 64, j = 2*c + (r >= 32), l = r % 32,
  q = (r < 32) ? (qs[32*c + l] & 0x0F) : (qs[32*c + l] >> 4)
  value[e] = float(d) * sc[j] * q - float(dmin) * m[j]
""" + _ROW.format(qk=256, bb=144, qk_1=255)

_Q2_K = """\
### Q2_K (super-blocks of 256 values, 84 bytes)
```c
typedef struct {
    uint8_t scales[16];   // bytes 0-15: per 16 values, low nibble = scale, high nibble = min
    uint8_t qs[64];       // bytes 16-79: 2-bit codes, four per byte
    half    d;            // bytes 80-81: scale of the scales
    half    dmin;         // bytes 82-83: scale of the mins
} block_q2_K;             // sizeof == 84 (note: d and dmin come LAST)
```
Element e (0..255): h = e / 128 (half), r = e % 128, s = r / 32 (shift index 0..3),
  t = r % 32, g = t / 16, l = t % 16,
  q   = (qs[32*h + 16*g + l] >> (2*s)) & 3
  k   = 8*h + 2*s + g                        (index into scales, 0..15)
  value[e] = float(d) * (scales[k] & 0x0F) * q - float(dmin) * (scales[k] >> 4)
So each byte qs[i] holds four codes, for elements that are 32 apart inside its half.
""" + _ROW.format(qk=256, bb=84, qk_1=255)

_IQ2_XXS = """\
### IQ2_XXS (super-blocks of 256 values, 66 bytes)
```c
typedef struct {
    half     d;           // bytes 0-1: super-block scale
    uint16_t qs[32];      // bytes 2-65: 8 groups of 32 values, 8 bytes (two uint32) per group
} block_iq2_xxs;          // sizeof == 66
```
Group ib (0..7) covers elements 32*ib .. 32*ib+31.  Read its 8 bytes as two little-endian uint32:
  a0 = bytes of qs[4*ib .. 4*ib+1],  a1 = bytes of qs[4*ib+2 .. 4*ib+3]
  db = float(d) * (0.5f + (a1 >> 28)) * 0.25f
For sub-group l (0..3), 8 values each:
  grid  = iq2xxs_grid[(a0 >> (8*l)) & 0xFF]        (uint64: byte j is the magnitude of value j)
  signs = iq2xxs_signs[(a1 >> (7*l)) & 127]         (bit j set: value j is negative)
  value[32*ib + 8*l + j] = db * byte_j(grid) * ((signs >> j) & 1 ? -1 : 1)   for j in 0..7
Magnitudes are 8, 25 or 43 (0x08, 0x19, 0x2b).  The two tables are constants of the format;
use exactly these (signs[i] is i with an 8th bit that makes the popcount even):
""" + "{tables}\n" + _ROW.format(qk=256, bb=66, qk_1=255)


@lru_cache(maxsize=1)
def iq2xxs_tables_cuda() -> str:
    """The IQ2_XXS grid and sign tables as CUDA __constant__ arrays (from gguf-py)."""
    import numpy as np
    from gguf.quants import IQ2_XXS

    IQ2_XXS.init_grid()
    grid = np.asarray(IQ2_XXS.grid).reshape(256, 8).astype(np.uint64)
    packed = [int(sum(int(v) << (8 * j) for j, v in enumerate(row))) for row in grid]
    signs = [int(s) for s in np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)]
    out = ["```cuda", "static __constant__ uint64_t iq2xxs_grid[256] = {"]
    for i in range(0, 256, 4):
        out.append("    " + ", ".join(f"0x{g:016x}ULL" for g in packed[i : i + 4]) + ",")
    out.append("};")
    out.append("static __constant__ uint8_t iq2xxs_signs[128] = {")
    for i in range(0, 128, 16):
        out.append("    " + ", ".join(f"0x{s:02x}" for s in signs[i : i + 16]) + ",")
    out += ["};", "```"]
    return "\n".join(out)


def layout_text(qtype: str) -> str:
    name = canonical(qtype)
    if name is None:
        raise KeyError(f"no block layout description for {qtype!r}")
    text = {"F32": _F32, "F16": _F16, "Q8_0": _Q8_0, "Q4_K": _Q4_K, "Q2_K": _Q2_K, "IQ2_XXS": _IQ2_XXS}[name]
    if name == "IQ2_XXS":
        text = text.replace("{tables}", iq2xxs_tables_cuda())
    return text


_NAME_TOKEN = re.compile(r"(?<![a-z0-9])(iq2_xxs|q8_0|q2_k|q4_k|f16)(?![a-z0-9])", re.I)


def quant_types_from_text(*texts: str) -> list[str]:
    """Quant types named in a unit's name or doc comment ('matmul_q8_0', 'in Q2_K'), in order seen."""
    seen: list[str] = []
    for text in texts:
        for m in _NAME_TOKEN.finditer(text or ""):
            name = canonical(m.group(1))
            if name and name not in seen:
                seen.append(name)
    return seen
