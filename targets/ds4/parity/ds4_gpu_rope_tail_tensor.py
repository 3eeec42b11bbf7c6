"""Parity spec: ds4_gpu_rope_tail_tensor (in place: x is [n_tok][n_head][head_dim]).

Only the last n_rot = 64 of each head's 512 values rotate, in adjacent pairs,
token t at position pos0 + t (reference.ds4_ops.rope_tail has the formula).
ds4 uses two settings: dense layers (freq_base 10000, no scaling) and
compressed layers (YaRN: freq_base 160000, freq_scale 1/16, ext_factor 1,
attn_factor 1/(1 + 0.1 ln 16) so the magnitude is unchanged, beta 32/1,
original context 65536); `inverse` rotates the attention output back.

Tolerance: a kernel computes the angle pos * base^(-2j/n_rot) in float32; at
positions up to ~4100 that angle is off by up to ~1e-3 rad for the fastest
pair, which moves a value by |x| * 1e-3 (a few 1e-3 of the RMS).  The bounds
(max element 1e-2 of the RMS, NMSE 1e-6) allow that and nothing like a
wrong pair layout, base, scale or direction (errors of order 1)."""
import math

import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_ops as ops

DENSE = {"n_ctx_orig": 0, "freq_base": ops.ROPE_FREQ_BASE, "freq_scale": 1.0, "ext_factor": 0.0,
         "attn_factor": 1.0, "beta_fast": ops.ROPE_YARN_BETA_FAST, "beta_slow": ops.ROPE_YARN_BETA_SLOW}
YARN = {"n_ctx_orig": ops.ROPE_ORIG_CTX, "freq_base": ops.COMPRESS_ROPE_FREQ_BASE,
        "freq_scale": 1.0 / ops.ROPE_SCALE_FACTOR, "ext_factor": 1.0,
        "attn_factor": 1.0 / (1.0 + 0.1 * math.log(ops.ROPE_SCALE_FACTOR)),
        "beta_fast": ops.ROPE_YARN_BETA_FAST, "beta_slow": ops.ROPE_YARN_BETA_SLOW}
SCALARS = ("n_tok", "n_head", "head_dim", "n_rot", "pos0", "n_ctx_orig", "inverse", "freq_base", "freq_scale",
           "ext_factor", "attn_factor", "beta_fast", "beta_slow")


def build(shape, ctx, rng):
    d = dict(shape.dims)
    x = rng.standard_normal((d["n_tok"], d["n_head"], d["head_dim"])).astype(np.float32)
    args = {"x": InOut(x), **{k: d[k] for k in SCALARS}}
    args["inverse"] = bool(d["inverse"])  # a C bool
    if shape.expect == "error":
        return Call(args=args)
    ref = ops.rope_tail(x, *(d[k] for k in SCALARS))
    return Call(args=args, expect={"x": ref})


# Positions at 64k: upstream's rope_tail_kernel takes theta = (float)pos * powf(base, -i / n_rot) in
# float32, whose spacing there is 0.004 rad.  A float32 emulation of that kernel against this float64
# reference (3 tokens x 8 heads, seed 0): max|err|/rms 2.3e-3 dense / 4.2e-3 YaRN at 65535, inside the
# bound of 1e-2; 1.1e-2 (YaRN) at 262143 and 8e-2 (NMSE 3e-6) at 1048575, outside it -- upstream itself
# drifts there, so positions past 64k are left out rather than the bound loosened.
EDGE_FAR = "positions at 64k (float32 theta spacing 0.004 rad); farther ones left out, see the comment"


def dims(n_tok, n_head, pos0, inverse=False, head_dim=ops.HEAD_DIM, n_rot=ops.N_ROT, mode=DENSE):
    return {"n_tok": n_tok, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot, "pos0": pos0,
            "inverse": inverse, **mode}


SPEC = UnitSpec(
    unit="ds4_gpu_rope_tail_tensor",
    reference="reference.ds4_ops.rope_tail",
    inputs="x ~ N(0, 1); ds4's dense and YaRN settings; positions 0 .. 4093, and 65533 .. 65535 at the edge",
    outputs={"x": Tol(nmse=1e-6, max_err_rms=1e-2)},
    shapes=[
        Shape("q, dense layer: 64 heads x 512, 1 token at 5", dims(1, ops.N_HEAD, 5)),
        Shape("q, compressed layer (YaRN): 64 heads, 3 tokens at 4093", dims(3, ops.N_HEAD, 4093, mode=YARN)),
        Shape("kv, dense: 1 head, 7 tokens at 1000", dims(7, 1, 1000)),
        Shape("kv, YaRN: 1 head, 5 tokens at 0", dims(5, 1, 0, mode=YARN)),
        Shape("attention output, inverse YaRN: 64 heads, 2 tokens at 77", dims(2, ops.N_HEAD, 77, True, mode=YARN)),
        Shape("inverse dense: 3 heads, 1 token at 2049", dims(1, 3, 2049, True)),
        Shape("odd: 3 heads x 96, n_rot 32, 5 tokens at 11", dims(5, 3, 11, head_dim=96, n_rot=32)),
        Shape("q, YaRN: 64 heads, 2 tokens at 65534", dims(2, ops.N_HEAD, 65534, mode=YARN), edge=EDGE_FAR),
        Shape("kv, dense: 1 head, 3 tokens at 65533", dims(3, 1, 65533), edge=EDGE_FAR),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 64 heads x 512, 64 tokens at 0", dims(64, ops.N_HEAD, 0)),
        Shape("prefill chunk: 64 heads x 512, 2048 tokens at 2048 (timing)", dims(2048, ops.N_HEAD, 2048),
              timed=True),
        Shape("error: odd n_rot", dims(1, 2, 3, head_dim=64, n_rot=33), expect="error",
              why="n_rot must be even"),
        Shape("error: n_rot > head_dim", dims(1, 2, 3, head_dim=32, n_rot=64), expect="error",
              why="n_rot must not exceed head_dim"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_tok"] * s.dims["n_head"] * s.dims["n_rot"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
