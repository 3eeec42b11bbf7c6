"""Scenario spec: mini_gpu_tensor_bytes (a runtime unit, checked by behaviour across calls).

Checks: mini_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_bytes(s, case.dims['sizes'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_bytes",
    cases=[
        Case('sizes 1, 3, 4099, 65537', {'sizes': (1, 3, 4099, 65537)}),
    ],
    build=build,
    checks="mini_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views",
)
