"""Parity spec: ds4_gpu_compressor_prefill_state_ratio4_tensor (the ratio-4 compressor state
after a prefill that ends on a window boundary, rebuilt from that last window's 4
tokens at positions pos0..pos0 + 3 (pos0 a multiple of 4): the token at position p
in state row p % 4, its score + APE[p % 4]; rows 4..7 empty (kv 0, score -inf);
the previous contents of the state do not matter).

Shapes: the attention lane (512 wide, width 1024), the indexer lane (128), F16
and F32 APE, odd widths.

Tolerance: bit-exact (copies and one float32 add)."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

I = sibling(__file__, "_attn_inputs")


def build(shape, ctx, rng):
    d = shape.dims
    hd, pos0, ape_type = d["head_dim"], d["pos0"], d["ape_type"]
    width = 2 * hd
    m, a_off, _ = I.compressor_map(rng, width, 4, hd, ape_type)
    kv, sc = I.compressor_tokens(rng, d.get("tail_rows", 4), width)
    skv, ssc = I.compressor_state(rng, 4, width)
    args = {"state_kv": InOut(skv), "state_score": InOut(ssc), "kv_tail": In(kv), "sc_tail": In(sc), "model_map": m,
            "model_size": m.size, "ape_offset": a_off, "ape_type": ape_type, "head_dim": hd, "pos0": pos0}
    if shape.expect == "error":
        return Call(args=args)
    rkv, rsc = A.compressor_prefill_state_ratio4(skv, ssc, kv, sc, m.array, a_off, ape_type, hd, pos0)
    return Call(args=args, expect={"state_kv": rkv, "state_score": rsc})


def dims(pos0, head_dim=512, ape_type=1, **kw):
    return {"pos0": pos0, "head_dim": head_dim, "ape_type": ape_type, **kw}


ATTN = "attention lane: 512 wide, window at 4092 (timing)"
DISPATCH = {"compressor_set_rows_kernel": f"the only path -> reached by shape '{ATTN}'"}
EXACT = Tol(nmse=None, max_err_rms=None, max_abs=0.0)

SPEC = UnitSpec(
    unit="ds4_gpu_compressor_prefill_state_ratio4_tensor",
    reference="reference.ds4_attention_ops.compressor_prefill_state_ratio4",
    inputs=I.COMPRESSOR_INPUTS,
    outputs={"state_kv": EXACT, "state_score": EXACT},
    shapes=[
        Shape(ATTN, dims(4092), timed=True),
        Shape("window at 0, F32 APE", dims(0, ape_type=0)),
        Shape("indexer lane: 128 wide, window at 124", dims(124, head_dim=128)),
        Shape("odd: 96 wide, window at 8", dims(8, head_dim=96)),
        Shape("error: ape_type 2", dims(0, ape_type=2), expect="error", why="APE is F32 (0) or F16 (1)"),
        Shape("error: tail of 3 tokens", dims(0, tail_rows=3), expect="error", why="the tail is one whole window"),
    ],
    build=build,
    bytes_moved=lambda s: 4 * (2 * 4 * 2 * s.dims["head_dim"] + 2 * 8 * 2 * s.dims["head_dim"]),
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
