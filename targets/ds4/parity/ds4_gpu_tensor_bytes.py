"""Scenario spec: ds4_gpu_tensor_bytes (a runtime unit, checked by behaviour across calls).

Checks: ds4_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_bytes(s, case.dims['sizes'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_tensor_bytes",
    cases=[
        Case('sizes 1, 3, 4099, 65537', {'sizes': (1, 3, 4099, 65537)}),
    ],
    build=build,
    checks="ds4_gpu_tensor_bytes is the size given to alloc or view, for odd sizes and empty views",
)
