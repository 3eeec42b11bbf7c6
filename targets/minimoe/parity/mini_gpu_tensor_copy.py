"""Scenario spec: mini_gpu_tensor_copy (a runtime unit, checked by behaviour across calls).

Checks: copies between odd ranges of tensors and views move exactly those bytes; ranges outside either side are refused; ranges past a view's end are refused even inside its base; 0-byte copies at ends and on empty tensors succeed; NULL tensors are refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")

# the calls the edge case makes besides alloc and free (its other cases make them too)
CALLS = {'write', 'read', 'copy', 'view'}


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        rt.play_edges(s, case.dims['n'], CALLS)
        return s
    rt.play_copy(s, case.dims['n1'], case.dims['n2'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_copy",
    cases=[
        Case('1031 -> 2063 bytes', {'n1': 1031, 'n2': 2063}),
        Case('65537 -> 4099 bytes', {'n1': 65537, 'n2': 4099}),
        Case('edges: ranges at view ends inside the base, empty and NULL tensors', {'n': 4099, 'edges': True}),
    ],
    build=build,
    checks="copies between odd ranges of tensors and views move exactly those bytes; ranges outside either side are refused; ranges past a view's end are refused even inside its base; 0-byte copies at ends and on empty tensors succeed; NULL tensors are refused",
)
