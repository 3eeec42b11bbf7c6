"""Scenario spec: ds4_gpu_tensor_view (a runtime unit, checked by behaviour across calls).

Checks: a view aliases [offset, offset+bytes) of its base (reads, writes, nesting) and refuses ranges outside it.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_view(s, case.dims['n'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_tensor_view",
    cases=[
        Case('base of 2053 bytes, view at 37', {'n': 2053}),
        Case('base of 65537 bytes, view at 37', {'n': 65537}),
    ],
    build=build,
    checks="a view aliases [offset, offset+bytes) of its base (reads, writes, nesting) and refuses ranges outside it",
)
