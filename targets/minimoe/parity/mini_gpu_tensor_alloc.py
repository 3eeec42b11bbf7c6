"""Scenario spec: mini_gpu_tensor_alloc (a runtime unit, checked by behaviour across calls).

Checks: allocations hold their size, never alias, round-trip odd sizes; an impossible size is refused with NULL; an empty allocation is a tensor of 0 bytes that 0-byte transfers accept.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        n = case.dims['n']
        rt.play_empty(s, n, {'write', 'read'})
        return s
    rt.play_alloc(s, case.dims['n'])
    rt.play_roundtrip(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_alloc",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('1 byte', {'n': 1}),
        Case('1 MiB + 3 bytes', {'n': 1048579}),
        Case('edges: an empty allocation (0 bytes)', {'n': 4099, 'edges': True}),
    ],
    build=build,
    checks="allocations hold their size, never alias, round-trip odd sizes; an impossible size is refused with NULL; an empty allocation is a tensor of 0 bytes that 0-byte transfers accept",
)
