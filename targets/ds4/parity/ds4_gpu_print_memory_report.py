"""Scenario spec: ds4_gpu_print_memory_report (a runtime unit, checked by behaviour across calls).

Checks: the memory report prints before and after a model map without crashing, and the backend works after it.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng)
    rt.play_init(s)
    rt.play_memory_report(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_print_memory_report",
    cases=[
        Case('before and after a model map', {}),
    ],
    build=build,
    checks="the memory report prints before and after a model map without crashing, and the backend works after it",
)
