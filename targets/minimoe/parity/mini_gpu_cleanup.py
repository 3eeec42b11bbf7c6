"""Scenario spec: mini_gpu_cleanup (a runtime unit, checked by behaviour across calls).

Checks: work enqueued before mini_gpu_cleanup() is complete when it returns; init after cleanup starts the backend again.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_ordering(s, case.dims['n'], 'cleanup')
    rt.play_roundtrip(s, 1031)
    return s


SCENARIO = Scenario(
    unit="mini_gpu_cleanup",
    cases=[
        Case('copy of 65537 bytes queued behind a busy stream, then cleanup', {'n': 65537}),
    ],
    build=build,
    checks="work enqueued before mini_gpu_cleanup() is complete when it returns; init after cleanup starts the backend again",
)
