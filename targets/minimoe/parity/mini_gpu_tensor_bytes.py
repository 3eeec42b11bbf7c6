"""Scenario spec: mini_gpu_tensor_bytes (a runtime unit, checked by behaviour across calls).

Checks: mini_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views; an empty allocation and its views hold 0 bytes, and so does NULL.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        n = case.dims['n']
        rt.play_empty(s, n, {'bytes', 'view'})
        rt.play_null_args(s, n, {'bytes', 'view'})
        return s
    rt.play_bytes(s, case.dims['sizes'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_bytes",
    cases=[
        Case('sizes 1, 3, 4099, 65537', {'sizes': (1, 3, 4099, 65537)}),
        Case('edges: an empty allocation, NULL', {'n': 4099, 'edges': True}),
    ],
    build=build,
    checks="mini_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views; an empty allocation and its views hold 0 bytes, and so does NULL",
)
