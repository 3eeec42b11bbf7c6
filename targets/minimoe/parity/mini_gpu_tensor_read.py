"""Scenario spec: mini_gpu_tensor_read (a runtime unit, checked by behaviour across calls).

Checks: reads at odd offsets and sizes return exactly those bytes into the caller's buffer; bad ranges are refused; ranges past a view's end are refused even inside its base; 0-byte reads at ends and of empty tensors succeed; NULL tensors and buffers are refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")

# the calls the edge case makes besides alloc and free (view too, which the other cases never call: `uses`)
CALLS = {'write', 'read', 'view'}


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    if case.dims.get('edges'):
        rt.play_edges(s, case.dims['n'], CALLS)
        return s
    rt.play_read_offsets(s, case.dims['n'])
    rt.play_roundtrip(s, case.dims['n'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_read",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('65537 bytes', {'n': 65537}),
        Case('edges: ranges at view ends inside the base, empty and NULL arguments', {'n': 4099, 'edges': True}),
    ],
    build=build,
    # every other unit the cases call (scenario_uses builds case 0 only, which makes no view)
    uses=("mini_gpu_init", "mini_gpu_tensor_alloc", "mini_gpu_tensor_write", "mini_gpu_tensor_view",
          "mini_gpu_tensor_free"),
    checks="reads at odd offsets and sizes return exactly those bytes into the caller's buffer; bad ranges are refused; ranges past a view's end are refused even inside its base; 0-byte reads at ends and of empty tensors succeed; NULL tensors and buffers are refused",
)
