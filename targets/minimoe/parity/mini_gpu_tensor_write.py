"""Scenario spec: mini_gpu_tensor_write (a runtime unit, checked by behaviour across calls).

Checks: writes at odd offsets land there and nowhere else; writes outside a tensor or a view are refused and change nothing; ranges past a view's end are refused even inside its base; 0-byte writes at ends and into empty tensors succeed; NULL tensors and buffers are refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")

# the calls the edge case makes besides alloc and free (its other cases make them too)
CALLS = {'write', 'read', 'view'}


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        rt.play_edges(s, case.dims['n'], CALLS)
        return s
    rt.play_roundtrip(s, case.dims['n'])
    rt.play_write_errors(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_write",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('1 MiB + 3 bytes', {'n': 1048579}),
        Case('edges: ranges at view ends inside the base, empty and NULL arguments', {'n': 4099, 'edges': True}),
    ],
    build=build,
    checks="writes at odd offsets land there and nowhere else; writes outside a tensor or a view are refused and change nothing; ranges past a view's end are refused even inside its base; 0-byte writes at ends and into empty tensors succeed; NULL tensors and buffers are refused",
)
