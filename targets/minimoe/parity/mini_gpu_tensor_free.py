"""Scenario spec: mini_gpu_tensor_free (a runtime unit, checked by behaviour across calls).

Checks: freeing a view leaves its base usable, free(NULL) is harmless, alloc/free returns the device memory.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_free(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_free",
    cases=[
        Case('views at odd offsets, 12 x 32 MiB alloc/free', {'n': 4099}),
    ],
    build=build,
    checks="freeing a view leaves its base usable, free(NULL) is harmless, alloc/free returns the device memory",
)
