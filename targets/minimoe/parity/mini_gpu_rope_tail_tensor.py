"""Parity spec: mini_gpu_rope_tail_tensor (in place; only the last n_rot dims of each head
rotate, adjacent pairs, theta_j = (pos0+t) * freq_base^(-2j/n_rot)).

Real cases are the engine's calls (q: 4 heads, k: 1 head, head_dim 64, n_rot 16,
freq_base 10000) at pos0 0, 5 and 63; synthetic ones use another head_dim,
n_rot, freq_base and pos0 = 1000 (float32 angle error grows with the position,
hence NMSE <= 1e-7)."""
import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_head, head_dim, n_rot, pos0, fb = (d["n_tokens"], d["n_head"], d["head_dim"], d["n_rot"],
                                                   d["pos0"], d["freq_base"])
    x = rng.standard_normal((n_tokens, n_head, head_dim)).astype(np.float32)
    return Call(
        args={"x": InOut(x), "n_tokens": n_tokens, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot,
              "pos0": pos0, "freq_base": fb},
        expect={"x": ops.rope_tail(x, n_tokens, n_head, head_dim, n_rot, pos0, fb)},
    )


REAL = {"head_dim": 64, "n_rot": 16, "freq_base": 10000.0}

BASE = Shape("odd: 7 x 3 heads, head_dim 10, n_rot 6, base 500, pos0 3",
             {"n_tokens": 7, "n_head": 3, "head_dim": 10, "n_rot": 6, "pos0": 3, "freq_base": 500.0})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("x",))

SPEC = UnitSpec(
    unit="mini_gpu_rope_tail_tensor",
    reference="reference.minimoe_ops.rope_tail",
    inputs="x ~ N(0, 1); positions from 0 to the case's pos0",
    outputs={"x": Tol(nmse=1e-7, max_err_rms=2e-3)},
    shapes=[
        Shape("q: 7 tokens x 4 heads at pos0 0", dict(REAL, n_tokens=7, n_head=4, pos0=0)),
        Shape("k: 3 tokens x 1 head at pos0 5", dict(REAL, n_tokens=3, n_head=1, pos0=5)),
        Shape("q decode: 1 token x 4 heads at pos0 63", dict(REAL, n_tokens=1, n_head=4, pos0=63)),
        BASE,
        Shape("full rotation: n_rot = head_dim 8, pos0 1000",
              {"n_tokens": 5, "n_head": 2, "head_dim": 8, "n_rot": 8, "pos0": 1000, "freq_base": 10000.0}),
        Shape("q prefill: 512 tokens x 4 heads (bandwidth)", dict(REAL, n_tokens=512, n_head=4, pos0=0), timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 8 * s.dims["n_tokens"] * s.dims["n_head"] * s.dims["head_dim"],
)
