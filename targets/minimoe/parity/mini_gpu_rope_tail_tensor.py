"""Parity spec: mini_gpu_rope_tail_tensor (in place; only the last n_rot dims of each head
rotate, adjacent pairs, theta_j = (pos0+t) * freq_base^(-2j/n_rot)).

Real cases are the engine's calls (q: 4 heads, k: 1 head, head_dim 64, n_rot 16,
freq_base 10000) at pos0 0, 5 and 63; synthetic ones use another head_dim,
n_rot, freq_base and pos0 = 1000 (float32 angle error grows with the position,
hence NMSE <= 1e-7).

Past the engine's calls: a prefill of 1100 tokens x 32 heads (281,600 rotated
pairs, more than 1024 x 256 threads: a launch shaped for small work fails
there), heads at scales up to 1e6 (rope is linear, so any float32 x rotates to
the same relative accuracy; a rotation carried through half overflows past
65504), n_rot 0 (nothing rotates: x unchanged), calls with no tokens or no
heads (nothing to do: the Metal backend returns 0 once x holds, mini_metal.m),
and n_rot odd or past head_dim, which mini_gpu.h rules out ("n_rot is even and
<= head_dim"): every backend refuses them."""
import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, n_head, head_dim, n_rot, pos0, fb = (d["n_tokens"], d["n_head"], d["head_dim"], d["n_rot"],
                                                   d["pos0"], d["freq_base"])
    x = rng.standard_normal((n_tokens, n_head, head_dim))
    if d.get("wide_scales"):  # every (token, head) its own scale, 1e-2 .. 1e6 spread evenly in log
        scales = 10.0 ** np.linspace(-2.0, 6.0, n_tokens * n_head)
        x *= rng.permutation(scales).reshape(n_tokens, n_head, 1)
    x = x.astype(np.float32)
    args = {"x": InOut(x), "n_tokens": n_tokens, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot,
            "pos0": pos0, "freq_base": fb}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"x": ops.rope_tail(x, n_tokens, n_head, head_dim, n_rot, pos0, fb)})


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
        Shape("prefill 1100 tokens x 32 heads, head_dim 24, n_rot 16 (281,600 pairs: more than 1024 x 256)",
              {"n_tokens": 1100, "n_head": 32, "head_dim": 24, "n_rot": 16, "pos0": 0, "freq_base": 10000.0}),
        Shape("heads at scales 1e-2 .. 1e6, 5 tokens x 4 heads at pos0 20",
              dict(REAL, n_tokens=5, n_head=4, pos0=20, wide_scales=True),
              edge="values past half's range (65504): a rotation rounded through half overflows there"),
        Shape("n_rot 0: nothing rotates (x unchanged), 3 tokens x 2 heads",
              {"n_tokens": 3, "n_head": 2, "head_dim": 10, "n_rot": 0, "pos0": 3, "freq_base": 500.0}),
        Shape("no tokens (4 heads): nothing to do, success", dict(REAL, n_tokens=0, n_head=4, pos0=5),
              zero_answer="no tokens: an empty x, which any answer matches; the return code is the check"),
        Shape("no heads (3 tokens): nothing to do, success", dict(REAL, n_tokens=3, n_head=0, pos0=5),
              zero_answer="no heads: an empty x, which any answer matches; the return code is the check"),
        Shape("error: n_rot 5 is odd", dict(BASE.dims, n_rot=5), expect="error",
              why='mini_gpu.h: "n_rot is even and <= head_dim"; pairs are (x[2j], x[2j+1])'),
        Shape("error: n_rot 12 > head_dim 10", dict(BASE.dims, n_rot=12), expect="error",
              why='mini_gpu.h: "n_rot is even and <= head_dim"; the tail would start before the head'),
        Shape("q prefill: 512 tokens x 4 heads (bandwidth)", dict(REAL, n_tokens=512, n_head=4, pos0=0), timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 8 * s.dims["n_tokens"] * s.dims["n_head"] * s.dims["head_dim"],
)
