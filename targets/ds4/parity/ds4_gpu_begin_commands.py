"""Scenario spec: ds4_gpu_begin_commands (a runtime unit, checked by behaviour across calls).

Checks: begin_commands opens a batch that copies run in, again after each end.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_copy(s, 1031, 2063)
    rt.play_ordering(s, case.dims['n'], 'end_commands')
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_begin_commands",
    cases=[
        Case('copies in three batches, then fill + copy of 65536 bytes', {'n': 65536}),
    ],
    build=build,
    checks="begin_commands opens a batch that copies run in, again after each end",
)
