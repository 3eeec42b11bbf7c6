"""Parity spec: ds4_gpu_compressor_store_batch_tensor (the compressor's store step for tokens
at positions pos0..: token t's kv row and score row + APE[(pos0 + t) % ratio] go to
state row (pos0 + t) % ratio -- offset by 4 on ratio-4 layers, whose state has 8 rows
of width 2 x head_dim (the lower 4 hold the previous window); nothing is pooled).

ds4: attention compressor head_dim 512 (ratio 4: width 1024; ratio 128: 512),
indexer compressor head_dim 128 (ratio 4), APE stored as F16 (F32 accepted).
Shapes: one token, a whole ratio-4 window, most of a ratio-128 window, the
indexer lane, odd sizes.  Batches longer than the window are left out:
upstream stores their colliding rows concurrently (unordered), and ds4
stores at most one window per call.

Tolerance: bit-exact (copies and one float32 add)."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")


def build(shape, ctx, rng):
    d = shape.dims
    hd, ratio, n, ape_type = d["head_dim"], d["ratio"], d["n_tokens"], d["ape_type"]
    coff = 2 if ratio == 4 else 1
    width = coff * hd
    m, a_off, _ = I.compressor_map(rng, width, max(ratio, 1), hd, ape_type)
    kv, sc = I.compressor_tokens(rng, n, width)
    skv, ssc = I.compressor_state(rng, max(ratio, 1), width, cleared=d.get("cleared", ()))
    args = {"kv": In(kv), "sc": In(sc), "state_kv": InOut(skv), "state_score": InOut(ssc), "model_map": m,
            "model_size": m.size, "ape_offset": a_off, "ape_type": ape_type, "head_dim": hd, "ratio": ratio,
            "pos0": d["pos0"], "n_tokens": n}
    if shape.expect == "error":
        return Call(args=args)
    rkv, rsc = A.compressor_store_batch(kv, sc, skv, ssc, m.array, a_off, ape_type, hd, ratio, d["pos0"], n)
    return Call(args=args, expect={"state_kv": rkv, "state_score": rsc})


def dims(n_tokens, pos0, ratio=4, head_dim=512, ape_type=1, **kw):
    return {"n_tokens": n_tokens, "pos0": pos0, "ratio": ratio, "head_dim": head_dim, "ape_type": ape_type, **kw}


ONE = "decode: 1 token at 4097, ratio 4, 512 wide (F16 APE)"
DISPATCH = {"compressor_store_kernel": f"the only path -> reached by shape '{ONE}'"}
EXACT = Tol(nmse=None, max_err_rms=None, max_abs=0.0)

SPEC = UnitSpec(
    unit="ds4_gpu_compressor_store_batch_tensor",
    reference="reference.ds4_attention_ops.compressor_store_batch",
    inputs=I.COMPRESSOR_INPUTS,
    outputs={"state_kv": EXACT, "state_score": EXACT},
    shapes=[
        Shape(ONE, dims(1, 4097)),
        Shape("ratio 4: a whole window, 4 tokens at 8 (F32 APE), upper rows cleared before",
              dims(4, 8, ape_type=0, cleared=(4, 5, 6, 7))),
        Shape("ratio 4: 2 tokens at 6 (phases 2, 3)", dims(2, 6)),
        Shape("ratio 128: 1 token at 300", dims(1, 300, ratio=128)),
        Shape("ratio 128: 100 tokens at 128", dims(100, 128, ratio=128)),
        Shape("indexer lane: 128 wide, ratio 4, 3 tokens at 1", dims(3, 1, head_dim=128)),
        Shape("odd: 96 wide, ratio 3, 2 tokens at 5", dims(2, 5, ratio=3, head_dim=96)),
        Shape("prefill tail, ratio 128: 128 tokens at 0 (timing)", dims(128, 0, ratio=128), timed=True),
        Shape("error: ape_type 2", dims(1, 0, ape_type=2), expect="error", why="APE is F32 (0) or F16 (1)"),
        Shape("error: ratio 0", dims(1, 0, ratio=0), expect="error", why="no window"),
    ],
    build=build,
    bytes_moved=I.compressor_bytes("store"),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
