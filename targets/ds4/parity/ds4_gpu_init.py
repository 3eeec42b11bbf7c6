"""Scenario spec: ds4_gpu_init (a runtime unit, checked by behaviour across calls).

Checks: ds4_gpu_init() returns non-zero when a device is present, twice in a row, and the API works after it.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_roundtrip(s, case.dims['n'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_init",
    cases=[
        Case('init twice, round trip of 4099 bytes', {'n': 4099}),
    ],
    build=build,
    checks="ds4_gpu_init() returns non-zero when a device is present, twice in a row, and the API works after it",
)
