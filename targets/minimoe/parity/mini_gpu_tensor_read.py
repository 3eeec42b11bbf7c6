"""Scenario spec: mini_gpu_tensor_read (a runtime unit, checked by behaviour across calls).

Checks: reads at odd offsets and sizes return exactly those bytes into the caller's buffer; bad ranges are refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_read_offsets(s, case.dims['n'])
    rt.play_roundtrip(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_read",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('65537 bytes', {'n': 65537}),
    ],
    build=build,
    checks="reads at odd offsets and sizes return exactly those bytes into the caller's buffer; bad ranges are refused",
)
