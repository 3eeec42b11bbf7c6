#!/usr/bin/env python3
"""Print the IQ2_XXS format tables as CUDA __constant__ arrays.

The tables are format constants of GGML's IQ2_XXS block (not code): the
256-entry grid of 8 magnitudes from {8, 25, 43} and the 128 sign patterns
(7 stored bits + an even-parity 8th bit).  They are derived here from gguf-py's
quants.py (gguf.quants.IQ2_XXS), which stores the grid packed 2 bits a value,
so the scripted good answer for mini_gpu_routed_gate_up_iq2_xxs_tensor can be
regenerated and checked:

    python targets/minimoe/tools/gen_iq2xxs_tables.py > /tmp/tables.cuh
"""
from __future__ import annotations

import sys

import numpy as np


def tables() -> tuple[list[int], list[int]]:
    from gguf.quants import IQ2_XXS

    IQ2_XXS.init_grid()
    grid = np.asarray(IQ2_XXS.grid).reshape(256, 8).astype(np.uint64)
    # element j of a grid entry is byte j (little-endian) of its uint64
    packed = [int(sum(int(v) << (8 * j) for j, v in enumerate(row))) for row in grid]
    signs = list(np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8))
    for i, s in enumerate(signs):  # the 8th bit is the parity of the 7 stored ones
        assert s == (i | (0x80 if bin(i).count("1") % 2 else 0)), i
    return packed, [int(s) for s in signs]


def render() -> str:
    grid, signs = tables()
    out = ["static __constant__ uint64_t iq2xxs_grid[256] = {"]
    for i in range(0, 256, 4):
        out.append("    " + ", ".join(f"0x{g:016x}ULL" for g in grid[i : i + 4]) + ",")
    out.append("};")
    out.append("static __constant__ uint8_t iq2xxs_signs[128] = {")
    for i in range(0, 128, 16):
        out.append("    " + ", ".join(f"0x{s:02x}" for s in signs[i : i + 16]) + ",")
    out.append("};")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
