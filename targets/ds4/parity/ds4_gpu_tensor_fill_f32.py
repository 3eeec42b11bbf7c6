"""Scenario spec: ds4_gpu_tensor_fill_f32 (a runtime unit, checked by behaviour across calls).

Checks: fill_f32 writes count floats from the tensor's (or view's) start and nothing else; a count past the end is refused.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_fill(s, case.dims['n'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_tensor_fill_f32",
    cases=[
        Case('4099 bytes, 1021 floats', {'n': 4099}),
        Case('65537 bytes', {'n': 65537}),
    ],
    build=build,
    checks="fill_f32 writes count floats from the tensor's (or view's) start and nothing else; a count past the end is refused",
)
