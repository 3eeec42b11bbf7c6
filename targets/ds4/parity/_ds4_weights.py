"""Weights for the ds4 projection specs: the user's tensors by name or synthetic stand-ins.

A shape with source "model:<name>,..." gets its tensors through ctx.weights (the
user's GGUF when one is given, else synthetic tensors of the census type); a
"synthetic" shape (odd sizes no model has) gets random valid blocks in a map of
random bytes.  Either way: (Map, [offset per tensor], [GGML type name per tensor])."""
import numpy as np

from porter.spec import Context
from porter.spec.weights import Want
from reference import quant


def dense(shape, ctx, rng, tensors):
    """tensors: [(qtype, rows, cols)] with cols a whole number of blocks (Q8_0: padded to 32)."""
    if shape.model_tensors:
        m, placed = ctx.weights(shape, [Want(qt, (rows, cols)) for qt, rows, cols in tensors], rng)
        return m, [p.offset for p in placed], [p.qtype for p in placed]
    blobs = [quant.random_blocks(qt, rows, cols, rng) for qt, rows, cols in tensors]
    m, offs = Context.synthetic_map(blobs, rng, gap=8192)
    return m, offs, [qt for qt, _, _ in tensors]


def pad32(n):
    return (int(n) + 31) // 32 * 32

INPUTS = ("weights: the user's tensors of the census type when a model is given, else random valid blocks of "
          "that type (reference.quant.random_blocks) at random map offsets; activations ~ N(0, 1) per element "
          "(scaled where a case says so); long reductions at ds4's real widths (4096, 1024, 2048); edge cases: "
          "mirrored weight halves with cancelling x on an exact grid (cancelling_x), x ~ N(0, 1e5^2) at decode")


# ---- numerical edges of the projections ------------------------------------------------------
# Upstream accumulates every projection in float32 (integer Q8 block dots summed as float32 block
# sums, float32 warp sums, cuBLAS with float32 compute), so it stays exact where the terms of a dot
# product cancel or its value passes f16's range; a port that accumulates or stores in f16/bf16 does
# not.  Both generators are used only by cases that say so (Shape.edge): ordinary cases draw as before.

CANCEL_STEP = 2.0 ** -4  # x on the grid step * int, |int| <= 127: exact in f16, TF32 and Q8_0 (d = step)
CANCEL = ("mixed signs that cancel: the row's second half mirrors the first in the weights and is -x + a few grid "
          "steps in x, so each output is ~1e3 times smaller than the sum of its terms' magnitudes (an f16/bf16 "
          "accumulator loses it; float32 block sums keep it)")
HUGE = "x ~ N(0, 1e5^2) at decode: outputs ~1e5, past f16's 65504, far inside float32"


def cancelling_x(rng, n_tok, n, spread=1):
    """(n_tok, n) float32: first half q * step, second half -q + d (d an int in [-spread, spread]) times step.

    Every value sits on the grid step * int with |int| <= 127 and each 32-block holds a +-127, so
    Q8_0 activation quantization (d = amax/127 = step), the F16 and the TF32 rounding of x are exact:
    a right port meets the reference whichever of them it uses; only the accumulation differs."""
    h = n // 2
    assert n % 64 == 0, "halves of whole Q8_0 blocks"
    q = rng.integers(-126, 127, (n_tok, h))
    q[:, ::32] = 127 * rng.choice([-1, 1], (n_tok, h // 32))  # each block's max is exactly 127 steps
    d = rng.integers(-spread, spread + 1, (n_tok, h))
    d[:, ::32] = 0  # the mirrored block keeps its 127 too
    q2 = np.where(np.arange(h) % 32 == 0, -q, np.clip(-q + d, -126, 126))
    return (np.concatenate([q, q2], axis=1) * CANCEL_STEP).astype(np.float32)


def mirror_rows(m, offset, rows, row_bytes):
    """Make each weight row's second half a copy of its first (in place): with cancelling_x the
    products of the two halves cancel pairwise, whatever rounding the port applies to W."""
    assert row_bytes % 2 == 0
    a = m.array[offset:offset + rows * row_bytes].reshape(rows, row_bytes)
    a[:, row_bytes // 2:] = a[:, :row_bytes // 2]


def activations(rng, dims, shape):
    """x of `shape` for a case: cancelling halves (dims "cancel"), else N(0, 1) times dims "x_scale"."""
    if dims.get("cancel"):
        return cancelling_x(rng, int(np.prod(shape[:-1])), shape[-1]).reshape(shape)
    return (rng.standard_normal(shape) * dims.get("x_scale", 1.0)).astype(np.float32)


def mirror_if_cancelling(dims, m, offsets, rows, row_bytes):
    if dims.get("cancel"):
        for off in offsets:
            mirror_rows(m, off, rows, row_bytes)
