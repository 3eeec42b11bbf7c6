"""Scenario spec: mini_gpu_tensor_view (a runtime unit, checked by behaviour across calls).

Checks: a view aliases [offset, offset+bytes) of its base (reads, writes, nesting) and refuses ranges outside it; calls through a view are bounded by the view, not its base; views of empty tensors; a view of NULL is refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")

# the calls the edge case makes besides alloc and free (its other cases make them too)
CALLS = {'write', 'read', 'view', 'bytes'}


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        rt.play_edges(s, case.dims['n'], CALLS)
        return s
    rt.play_view(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_view",
    cases=[
        Case('base of 2053 bytes, view at 37', {'n': 2053}),
        Case('base of 65537 bytes, view at 37', {'n': 65537}),
        Case('edges: ranges at view ends inside the base, empty views, NULL base', {'n': 4099, 'edges': True}),
    ],
    build=build,
    checks="a view aliases [offset, offset+bytes) of its base (reads, writes, nesting) and refuses ranges outside it; calls through a view are bounded by the view, not its base; views of empty tensors; a view of NULL is refused",
)
