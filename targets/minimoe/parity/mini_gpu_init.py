"""Scenario spec: mini_gpu_init (a runtime unit, checked by behaviour across calls).

Checks: mini_gpu_init() returns 0 when a device is present, twice in a row, and the API works after it.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_roundtrip(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_init",
    cases=[
        Case('init twice, round trip of 4099 bytes', {'n': 4099}),
    ],
    build=build,
    checks="mini_gpu_init() returns 0 when a device is present, twice in a row, and the API works after it",
)
