"""Weights for the ds4 projection specs: the user's tensors by name or synthetic stand-ins.

A shape with source "model:<name>,..." gets its tensors through ctx.weights (the
user's GGUF when one is given, else synthetic tensors of the census type); a
"synthetic" shape (odd sizes no model has) gets random valid blocks in a map of
random bytes.  Either way: (Map, [offset per tensor], [GGML type name per tensor])."""
from porter.gates.parity.spec import Context
from porter.gates.parity.weights import Want
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
          "(scaled where a case says so); long reductions at ds4's real widths (4096, 1024, 2048)")
