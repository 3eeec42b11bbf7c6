"""Scenario spec: ds4_gpu_cleanup (a runtime unit, checked by behaviour across calls).

Checks: work enqueued before ds4_gpu_cleanup() (a fill and a copy in an open batch) is complete when it returns; init after cleanup starts the backend again.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_ordering(s, case.dims['n'], 'cleanup')
    rt.play_roundtrip(s, 1031)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_cleanup",
    cases=[
        Case('fill + copy of 65536 bytes behind a busy device, then cleanup', {'n': 65536}),
    ],
    build=build,
    checks="work enqueued before ds4_gpu_cleanup() (a fill and a copy in an open batch) is complete when it returns; init after cleanup starts the backend again",
)
