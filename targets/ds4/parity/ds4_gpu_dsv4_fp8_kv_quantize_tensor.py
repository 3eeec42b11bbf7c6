"""Parity spec: ds4_gpu_dsv4_fp8_kv_quantize_tensor (in place: the FP8 E4M3 round trip of
each row's first head_dim - n_rot values, in blocks of 64 with a power-of-two
scale 2^ceil(log2(amax / 448)), amax floored at 1e-4; the RoPE tail untouched).

ds4 applies it to every KV row (512 wide, RoPE tail 64: 7 blocks) before the
raw cache and to every compressed row.  Shapes: decode (1 row), a prefill
batch, odd widths (one block, three blocks with no tail, n_rot = head_dim:
nothing to do), blocks whose amax is exactly 448 * 2^k with the other values
on midpoints between FP8 codes (the tie rule decides every one of them),
blocks of values ~1e-10 (the 1e-4 floor decides the scale, which sends them into the subnormal codes), an all-zero
block, and magnitudes far above 448 (the scale, not a clamp, must bring them
into range).

Tolerance: bit-exact.  Every step is exact in float32 (power-of-two scale,
table values) except log2f, which is exact at powers of two; a wrong tie rule,
saturation point or floor changes values by at least one FP8 step."""
import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A

TABLE = A.e4m3fn_table()


def _tie_rows(rng, n_tok, head_dim, n_rot):
    """Blocks with amax = 448 * 2^k and the rest on midpoints between adjacent FP8 codes."""
    x = np.zeros((n_tok, head_dim), np.float32)
    n_nope = head_dim - n_rot
    for b in range(n_nope // 64):
        k = rng.integers(-12, 4, n_tok)
        codes = rng.integers(1, 125, (n_tok, 64))
        mids = (TABLE[codes] + TABLE[codes + 1]) / 2
        blk = mids * np.ldexp(1.0, k)[:, None] * rng.choice([-1.0, 1.0], (n_tok, 64))
        blk[:, 0] = 448.0 * np.ldexp(1.0, k) * rng.choice([-1.0, 1.0], n_tok)
        x[:, b * 64:(b + 1) * 64] = blk
    x[:, n_nope:] = rng.standard_normal((n_tok, n_rot))
    return x.astype(np.float32)


def build(shape, ctx, rng):
    d = shape.dims
    n_tok, hd, n_rot = d["n_tok"], d["head_dim"], d["n_rot"]
    kind = d.get("kind", "normal")
    if kind == "ties":
        x = _tie_rows(rng, n_tok, hd, n_rot)
    else:
        scale = {"normal": 1.0, "tiny": 1e-10, "huge": 3e4}[kind]
        x = (rng.standard_normal((n_tok, hd)) * scale).astype(np.float32)
        if kind == "tiny":
            x[:, 64:128] = 0.0  # an all-zero block: amax floored, no 0/0
    args = {"x": InOut(x), "n_tok": n_tok, "head_dim": hd, "n_rot": n_rot}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"x": A.dsv4_fp8_kv_quantize(x, n_tok, hd, n_rot)})


def dims(n_tok, head_dim=A.HEAD_DIM, n_rot=A.N_ROT, kind="normal"):
    return {"n_tok": n_tok, "head_dim": head_dim, "n_rot": n_rot, "kind": kind}


DECODE = "decode: 1 KV row 512 (rot 64)"
DISPATCH = {
    "fp8_kv_quantize_kernel": f"the only path (one block of 64 threads per row) -> reached by shape '{DECODE}'",
}

SPEC = UnitSpec(
    unit="ds4_gpu_dsv4_fp8_kv_quantize_tensor",
    reference="reference.ds4_attention_ops.dsv4_fp8_kv_quantize",
    inputs="KV rows ~ N(0, s^2) per row, and rows built on e4m3 codes times powers of two (exact, halfway and saturating values)",
    outputs={"x": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape(DECODE, dims(1)),
        Shape("7 rows", dims(7)),
        Shape("ties: 5 rows, every block's amax 448 * 2^k, the rest on code midpoints", dims(5, kind="ties")),
        Shape("tiny: 3 rows of ~1e-10 and a zero block (the 1e-4 amax floor pushes them subnormal)", dims(3, kind="tiny")),
        Shape("huge: 3 rows of ~3e4 (scale up, no clamp)", dims(3, kind="huge")),
        Shape("odd: head_dim 128, n_rot 64 (one block)", dims(4, 128, 64)),
        Shape("odd: head_dim 192, n_rot 0 (no tail)", dims(3, 192, 0)),
        Shape("odd: n_rot = head_dim (nothing quantized)", dims(2, 64, 64)),
        Shape("prefill: 2048 KV rows (timing)", dims(2048), timed=True),
        Shape("error: n_rot > head_dim", dims(1, 64, 128), expect="error", why="the tail cannot exceed the row"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_tok"] * s.dims["head_dim"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
