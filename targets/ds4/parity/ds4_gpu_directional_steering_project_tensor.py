"""Parity spec: ds4_gpu_directional_steering_project_tensor (in place: each row of x
[rows][width] minus scale * (row . dir) * dir, dir = row `layer` of directions
[layers][width]; scale 0 means steering is off, which the call reports as an error).

ds4 steers the attention and FFN outputs (width 4096) of one decode token or a
prompt batch with per-layer unit directions for its 43 layers.  The rows carry
a sizeable component along the chosen direction (so the projection changes
them by O(1)), the directions of different layers differ (reading layer 0 or a
neighbour is off), and scale is not 1.  Odd widths (100, 300, 1) exercise the
host's thread count for narrow rows.  Tolerance: a float32 dot product over 4096
(tree-summed) moves the coefficient by ~1e-6 relative."""
import numpy as np

from porter.spec import Call, In, InOut, Shape, Tol, UnitSpec, sibling
from reference import ds4_hc_ops as ref

hc = sibling(__file__, "_hc_common")

# upstream host function ds4_gpu_directional_steering_project_tensor (ds4_cuda.cu): threads = largest power of
# two <= min(width, 256); one launch
DISPATCH = {
    "directional_steering_project_kernel": "scale != 0, width and rows non-zero (rows blocks; 256 threads for width "
                                           ">= 256, fewer below) -> reached by shapes 'decode: 4096 wide, layer 42, "
                                           "scale 1' and 'odd: 3 rows x 100 (64 threads), layer 1, scale 0.7'",
}


def build(shape, ctx, rng):
    d = shape.dims
    layer, width, rows, scale = d["layer"], d["width"], d["rows"], d["scale"]
    n_dirs = d.get("n_dirs", hc.N_LAYER)
    dirs = rng.standard_normal((n_dirs, width))
    dirs = (dirs / np.linalg.norm(dirs, axis=1, keepdims=True)).astype(np.float32)
    x = hc.scaled_rows(rng, rows, width, 0.5, 2.0).astype(np.float64)
    if layer < n_dirs:  # a component along the steered direction of the size of the row's own values
        along = rng.uniform(1.0, 3.0, (rows, 1)) * np.sqrt(width) * np.abs(x).mean(axis=1, keepdims=True)
        x = x + along * dirs[layer].astype(np.float64)[None, :]
    x = x.astype(np.float32)
    args = {"x": InOut(x), "directions": In(dirs), "layer": layer, "width": width, "rows": rows, "scale": scale}
    if shape.expect == "error":
        return Call(args=args)
    return Call(args=args, expect={"x": ref.directional_steering_project(x, dirs, layer, width, rows, scale)})


def dims(rows, layer, scale, width=hc.N_EMBD, **kw):
    return {"rows": rows, "layer": layer, "scale": scale, "width": width, **kw}


SPEC = UnitSpec(
    unit="ds4_gpu_directional_steering_project_tensor",
    reference="reference.ds4_hc_ops.directional_steering_project",
    inputs="rows ~ N(0, s^2), s log-uniform in 0.5..2; directions ~ N(0, 1); rows given a component of 1..3 x their size along a direction",
    outputs={"x": Tol(nmse=1e-10, max_err_rms=3e-5)},
    shapes=[
        Shape("decode: 4096 wide, layer 42, scale 1", dims(1, hc.N_LAYER - 1, 1.0)),
        Shape("7 rows x 4096, layer 0, scale 0.5", dims(7, 0, 0.5)),
        Shape("odd: 3 rows x 100 (64 threads), layer 1, scale 0.7", dims(3, 1, 0.7, 100)),
        Shape("odd: 2 rows x 300, layer 5, scale -2", dims(2, 5, -2.0, 300)),
        Shape("width 1: 2 rows, layer 3, scale 0.25", dims(2, 3, 0.25, 1)),
        Shape("prefill: 64 rows x 4096, layer 17, scale 1.5", dims(64, 17, 1.5), timed=True),
        Shape("error: scale 0", dims(1, 2, 0.0, 64), expect="error", why="scale 0 means no steering: an error"),
        Shape("error: layer past the directions", dims(1, 4, 1.0, 64, n_dirs=4), expect="error",
              why="directions must hold layer + 1 rows"),
    ],
    build=build,
    bytes_moved=lambda s: 8 * s.dims["rows"] * s.dims["width"] + 4 * s.dims["width"],
)

# a NULL tensor upstream's first check refuses, one error case each (_null_guards.py)
SPEC = sibling(__file__, "_null_guards").with_null_tensors(SPEC)
