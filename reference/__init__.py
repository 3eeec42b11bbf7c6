"""CPU references (numpy) for porter's parity checks.

* ``reference.quant``: GGUF quant blocks (Q8_0, Q2_K, IQ2_XXS, Q4_K, F16, F32):
  dequantize through gguf-py, an independent decoder of our own to cross-check
  it, sizes, matvecs and random valid blocks.
* ``reference.minimoe_ops``: one numpy function per op of
  targets/minimoe/mini_gpu.h.
* ``reference.minimoe_model``: the whole minimoe engine forward in numpy.

See reference/README.md.
"""
from . import quant  # noqa: F401

__all__ = ["quant", "minimoe_ops", "minimoe_model"]
