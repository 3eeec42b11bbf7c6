"""Scenario spec: ds4_gpu_tensor_alloc_managed (a runtime unit, checked by behaviour across calls).

Checks: managed allocations behave as tensors (size, no aliasing, round trips) and their contents are host-readable after synchronize.
No impossible size is asked for here (ds4_gpu_tensor_alloc's scenario does that): asking the driver for more
managed memory than the card has free can hang the GPU itself, not only the candidate, and a check must not
endanger the machine the next candidate runs on.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_alloc(s, case.dims['n'], managed=True, refuse_huge=False)
    rt.play_managed_host(s, case.dims['n'])
    rt.play_roundtrip(s, case.dims['n'], managed=True)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_tensor_alloc_managed",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('65537 bytes', {'n': 65537}),
    ],
    build=build,
    checks="managed allocations behave as tensors (size, no aliasing, round trips) and their contents are host-readable after synchronize",
)
