"""Print the IQ2_XXS grid as the `static __constant__` table of ds4_cuda.cuh.

The grid is public GGML format data (iq2xxs_grid of ggml-common.h); porter
keeps it once, in reference/quant.py, and this prints the CUDA spelling of it.
tests/test_ds4_conventions.py checks that the header's table equals this
output, so the two cannot drift apart.

    python3 targets/ds4/cuda/gen_iq2_grid.py
"""

from __future__ import annotations

import sys
from pathlib import Path


def grid_table() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from reference.quant import IQ2XXS_GRID_U64

    words = [f"0x{int(w):016x}ull" for w in IQ2XXS_GRID_U64]
    rows = [", ".join(words[i:i + 4]) for i in range(0, len(words), 4)]
    body = ",\n".join("    " + r for r in rows)
    return f"static __constant__ uint64_t ds4_iq2xxs_grid[256] = {{\n{body},\n}};\n"


if __name__ == "__main__":
    sys.stdout.write(grid_table())
