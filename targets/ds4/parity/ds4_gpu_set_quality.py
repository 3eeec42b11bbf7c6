"""Scenario spec: ds4_gpu_set_quality (a runtime unit, checked by behaviour across calls).

Checks: quality mode on and off leaves the Q8_0 preload succeeding and products, round trips right.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng)
    rt.play_init(s)
    rt.play_quality(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_set_quality",
    cases=[
        Case('96x256 Q8_0', {}),
    ],
    build=build,
    checks="quality mode on and off leaves the Q8_0 preload succeeding and products, round trips right",
)
