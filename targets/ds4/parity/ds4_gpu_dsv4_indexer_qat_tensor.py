"""Parity spec: ds4_gpu_dsv4_indexer_qat_tensor (in place: each 128-wide indexer row goes
through a Hadamard transform scaled by 1/sqrt(128), then an FP4 E2M1 round trip in
blocks of 32 with a power-of-two scale 2^ceil(log2(amax / 6))).

ds4 applies it to the indexer's 64 query heads per token and to every
compressed index row.  Shapes: one token's 64 heads, one row, a prefill's
worth of rows, rows of a single spike (the Hadamard spreads it evenly, so
every block shares one scale), rows with one dominant block-half (so the
blocks' scales differ), tiny and huge magnitudes; head_dim != 128 and
n_rows 0 are refused upstream.

Tolerance: bit-exact.  The reference runs ds4.c's butterfly in float32 in the
same order, and the rest is exact (power-of-two scales, table values)."""
import numpy as np

from porter.spec import Call, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_attention_ops as A


def build(shape, ctx, rng):
    d = shape.dims
    n, hd = d["n_rows"], d["head_dim"]
    rows = max(n, 1)
    kind = d.get("kind", "normal")
    x = rng.standard_normal((rows, hd)).astype(np.float32)
    if kind == "spike":
        x = np.zeros((rows, hd), np.float32)
        x[np.arange(rows), rng.integers(0, hd, rows)] = rng.uniform(1, 4, rows) * rng.choice([-1, 1], rows)
        x += (rng.standard_normal((rows, hd)) * 1e-3).astype(np.float32)
    elif kind == "lopsided":
        x[:, :64] *= 20.0
    elif kind in ("tiny", "huge"):
        x *= {"tiny": 1e-20, "huge": 1e20}[kind]
    x = x.astype(np.float32)
    args = {"x": InOut(x), "n_rows": n, "head_dim": hd}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"x": A.dsv4_indexer_qat(x, n, hd)})


def dims(n_rows, head_dim=A.INDEXER_HEAD_DIM, kind="normal"):
    return {"n_rows": n_rows, "head_dim": head_dim, "kind": kind}


Q = "decode: one token, 64 indexer heads x 128"
DISPATCH = {
    "indexer_hadamard_fp4_kernel": f"the only path (128 threads per row) -> reached by shape '{Q}'",
}

SPEC = UnitSpec(
    unit="ds4_gpu_dsv4_indexer_qat_tensor",
    reference="reference.ds4_attention_ops.dsv4_indexer_qat",
    inputs="rows ~ N(0, 1), and one-hot rows (one value of 1..4, the rest ~ N(0, 1e-6)): a block's scale set by one value",
    outputs={"x": Tol(nmse=None, max_err_rms=None, max_abs=0.0)},
    shapes=[
        Shape(Q, dims(64)),
        Shape("one compressed index row", dims(1)),
        Shape("spikes: 9 rows, one large value each", dims(9, kind="spike")),
        Shape("lopsided: 8 rows, first half x20", dims(8, kind="lopsided")),
        Shape("tiny: 3 rows ~1e-20", dims(3, kind="tiny")),
        Shape("huge: 3 rows ~1e20", dims(3, kind="huge")),
        # untimed since the 2048-token case below (ds4.c's prefill chunk) times the same path at the size ds4 calls
        Shape("prefill: 512 tokens x 64 heads", dims(512 * 64)),
        Shape("prefill chunk: 2048 tokens x 64 heads (timing)", dims(2048 * 64), timed=True),
        Shape("error: head_dim 64", dims(4, 64), expect="error", why="the transform is 128-point only"),
        Shape("error: n_rows 0", dims(0), expect="error", why="no rows"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["n_rows"] * s.dims["head_dim"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
