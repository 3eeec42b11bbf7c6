"""Scenario spec: mini_gpu_synchronize (a runtime unit, checked by behaviour across calls).

Checks: a copy enqueued while the unit's stream is busy is complete when mini_gpu_synchronize() returns.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_ordering(s, case.dims['n'], 'synchronize')
    return s


SCENARIO = Scenario(
    unit="mini_gpu_synchronize",
    cases=[
        Case('copy of 65537 bytes behind a busy stream', {'n': 65537}),
        Case('copy of 4 MiB + 1 bytes behind a busy stream', {'n': 4194305}),
    ],
    build=build,
    checks="a copy enqueued while the unit's stream is busy is complete when mini_gpu_synchronize() returns",
)
