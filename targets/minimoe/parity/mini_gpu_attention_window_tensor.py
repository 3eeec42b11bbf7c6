"""Parity spec: mini_gpu_attention_window_tensor (causal sliding window, one shared KV
head, a learned per-head sink logit that takes probability mass).

Real cases read the fixture's sinks (blk.*.attn_sinks.weight) at their real
offsets with the engine's sizes (4 heads, head_dim 64, window 32, scale 1/8):
a prefill from position 0, a chunk at pos0 40 whose window no longer starts at
key 0, a decode step at position 63.  Synthetic cases use other head counts,
window 1, a window longer than the context, windows of 68 and 80 keys (past
the one 32-key chunk the real window fits, where a chunked online softmax
rescales what it has summed; head_dim 256, the most the kernel takes), and
larger sinks so that the sink's share of the mass is large (a kernel without
the sink fails by far), sinks level with scores shifted to +200 (where a sink's
low bits move the output), sinks 16 above the scores (the sink holds all but
about 1e-5 of the mass: each key's weight exp(s_j - m) is near 1e-7, which
float32 holds to 6e-8 relative and half only as a subnormal, tens of percent
off; the output is small, and judged relative to its own size), and a call
with no tokens (the Metal backend returns 0 for it).  A head_dim past both
backends' limits is left open (expect="either"): refused, or computed right;
never computed wrong."""
import numpy as np

from porter.spec import Call, Context, In, Out, Shape, Tol, UnitSpec, sibling
from reference import minimoe_ops as ops

E = sibling(__file__, "_edges")
sh = sibling(__file__, "_shared")


def build(shape, ctx, rng):
    d = shape.dims
    n_tokens, pos0, n_head, head_dim, window = d["n_tokens"], d["pos0"], d["n_head"], d["head_dim"], d["window"]
    scale = float(np.float32(d.get("scale", 1.0 / np.sqrt(head_dim))))
    n_pos = pos0 + n_tokens
    if shape.fixture_tensors:
        t = ctx.tensor(shape.fixture_tensors[0])
        m, off = ctx.fixture_map(), t.offset
    elif d.get("sink_at_scores"):
        # the sink level with the shifted scores, holding about half of the mass (sum_j exp(s_j - 200) is about
        # 3 per key at the edge's spread): its value then moves the output by its low bits, where a far
        # smaller sink is washed out by the max
        keys = min(window, n_pos)
        sinks = (E.SCORE_SHIFT + np.log(3.0 * keys) + rng.uniform(-1.0, 1.0, n_head)).astype("<f4")
        m, (off,) = Context.synthetic_map([sinks], rng)
    elif d.get("sink_above"):
        # the sink far above every score (scores ~ N(0, 1)): it takes nearly all the mass, the keys' weights
        # are tiny, and the output is their small weighted sum
        sinks = (d["sink_above"] + rng.uniform(-1.0, 1.0, n_head)).astype("<f4")
        m, (off,) = Context.synthetic_map([sinks], rng)
    else:
        sinks = rng.uniform(-1.0, 3.0, n_head).astype("<f4")
        m, (off,) = Context.synthetic_map([sinks], rng)
    if d.get("shift"):
        q, k = E.shifted_qk(rng, n_tokens, n_pos, n_head, head_dim, scale)
    else:
        q = rng.standard_normal((n_tokens, n_head, head_dim)).astype(np.float32)
        k = rng.standard_normal((n_pos, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_pos, head_dim)).astype(np.float32)
    ref = ops.attention_window(q, k, v, m.array, off, n_tokens, pos0, n_head, head_dim, window, scale)
    return Call(
        args={"out": Out("f32", (n_tokens, n_head, head_dim)), "q": In(q), "k_cache": In(k), "v_cache": In(v),
              "model_map": m, "model_size": m.size, "sinks_offset": off, "n_tokens": n_tokens, "pos0": pos0,
              "n_head": n_head, "head_dim": head_dim, "window": window, "scale": scale},
        expect={"out": ref},
    )


REAL = {"n_head": 4, "head_dim": 64, "window": 32}

# pos0 2: k_cache and v_cache hold 9 rows, q and out 7 tokens x 3 heads (each tensor a size of its own)
BASE = Shape("odd: 3 heads, head_dim 24, window 5, pos0 2, 7 tokens",
             {"n_tokens": 7, "pos0": 2, "n_head": 3, "head_dim": 24, "window": 5, "scale": 0.3})
BAD, build_checked = sh.with_bad_tensors(build, BASE, ("out", "q", "k_cache", "v_cache"))

SPEC = UnitSpec(
    unit="mini_gpu_attention_window_tensor",
    reference="reference.minimoe_ops.attention_window",
    inputs="q, k, v ~ N(0, 1) (scores ~ N(0, 1)); sinks: the fixture's or U(-1, 3); edge: " + E.EDGE_SHIFTED,
    outputs={"out": Tol(nmse=1e-7, max_err_rms=1e-3)},
    shapes=[
        Shape("prefill 7 tokens at pos0 0", dict(REAL, n_tokens=7, pos0=0), source="fixture:blk.0.attn_sinks.weight"),
        Shape("3 tokens at pos0 40 (window cut)", dict(REAL, n_tokens=3, pos0=40),
              source="fixture:blk.1.attn_sinks.weight"),
        Shape("decode 1 token at pos0 63", dict(REAL, n_tokens=1, pos0=63), source="fixture:blk.0.attn_sinks.weight"),
        BASE,
        Shape("window 1 (self only), head_dim 128, pos0 9",
              {"n_tokens": 1, "pos0": 9, "n_head": 2, "head_dim": 128, "window": 1}),
        Shape("window 100 > context, 5 tokens", {"n_tokens": 5, "pos0": 0, "n_head": 4, "head_dim": 64, "window": 100}),
        # a kernel walks keys in chunks (the known-good 32 at a time, one per lane): the engine's window of 32
        # fits one chunk, so only a longer window reaches the running max's rescale across chunks
        Shape("window 100 at pos0 60, 8 tokens (68 keys: past one 32-key chunk)",
              {"n_tokens": 8, "pos0": 60, "n_head": 4, "head_dim": 64, "window": 100}),
        Shape("window 80 at pos0 90, head_dim 256, 5 tokens, scores +200 (the max moves between chunks)",
              {"n_tokens": 5, "pos0": 90, "n_head": 3, "head_dim": 256, "window": 80, "shift": True},
              edge=E.EDGE_SHIFTED),
        Shape("prefill 7 tokens at pos0 0, scores +200", dict(REAL, n_tokens=7, pos0=0, shift=True),
              source="fixture:blk.0.attn_sinks.weight", edge=E.EDGE_SHIFTED),
        Shape("decode 1 token at pos0 63, scores +200", dict(REAL, n_tokens=1, pos0=63, shift=True),
              source="fixture:blk.1.attn_sinks.weight", edge=E.EDGE_SHIFTED),
        Shape("odd: 3 heads, head_dim 24, window 5, scale 0.3, scores +200",
              {"n_tokens": 7, "pos0": 2, "n_head": 3, "head_dim": 24, "window": 5, "scale": 0.3, "shift": True},
              edge=E.EDGE_SHIFTED),
        Shape("sinks at the scores' scale (+200, about half the mass), 8 heads, 5 tokens at pos0 40",
              {"n_tokens": 5, "pos0": 40, "n_head": 8, "head_dim": 64, "window": 32, "shift": True,
               "sink_at_scores": True}, edge=E.EDGE_SHIFTED),
        # the sink holds nearly all the mass: keys' weights near 1e-7, a subnormal in half (far off).  Not an
        # `edge=` case: this spec's edges are where a softmax without its max overflows (tests/test_spec_edges.py)
        Shape("sinks 16 above the scores (all but ~1e-5 of the mass), 5 tokens at pos0 40",
              dict(REAL, n_tokens=5, pos0=40, sink_above=16.0)),
        # the Metal backend returns 0 once its arguments hold and there is no query (n_q == 0)
        Shape("no tokens at pos0 5: nothing to do, success", {"n_tokens": 0, "pos0": 5, **REAL},
              zero_answer="no tokens: an empty output, which any answer matches; the return code is the check"),
        Shape("head_dim 288, 3 tokens at pos0 4, window 6: past the known-good's 256 and Metal's 128",
              {"n_tokens": 3, "pos0": 4, "n_head": 2, "head_dim": 288, "window": 6}, expect="either",
              why="mini_gpu.h sets no head_dim limit: the Metal backend refuses above 128, the CUDA known-good "
                  "above 256; a backend may refuse it, or compute it right"),
        Shape("prefill 128 tokens (timing)", dict(REAL, n_tokens=128, pos0=0), source="fixture:blk.1.attn_sinks.weight",
              timed=True),
    ] + BAD,
    build=build_checked,
    bytes_moved=lambda s: 4 * s.dims["head_dim"] * (2 * s.dims["n_tokens"] * s.dims["n_head"]
                                                    + 2 * (s.dims["pos0"] + s.dims["n_tokens"])),
)
