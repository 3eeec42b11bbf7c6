"""Scenario spec: mini_gpu_tensor_copy (a runtime unit, checked by behaviour across calls).

Checks: copies between odd ranges of tensors and views move exactly those bytes; ranges outside either side are refused.
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_copy(s, case.dims['n1'], case.dims['n2'])
    return s


SCENARIO = Scenario(
    unit="mini_gpu_tensor_copy",
    cases=[
        Case('1031 -> 2063 bytes', {'n1': 1031, 'n2': 2063}),
        Case('65537 -> 4099 bytes', {'n1': 65537, 'n2': 4099}),
    ],
    build=build,
    checks="copies between odd ranges of tensors and views move exactly those bytes; ranges outside either side are refused",
)
