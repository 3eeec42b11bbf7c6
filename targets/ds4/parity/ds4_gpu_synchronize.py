"""Scenario spec: ds4_gpu_synchronize (a runtime unit, checked by behaviour across calls).

Checks: work enqueued while the device is busy (a fill, a copy in an open batch) is complete when synchronize returns.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_ordering(s, case.dims['n'], 'synchronize')
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_synchronize",
    cases=[
        Case('fill + copy of 65536 bytes', {'n': 65536}),
        Case('fill + copy of 4 MiB', {'n': 4 << 20}),
    ],
    build=build,
    checks="work enqueued while the device is busy (a fill, a copy in an open batch) is complete when synchronize returns",
)
