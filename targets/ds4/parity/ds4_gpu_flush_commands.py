"""Scenario spec: ds4_gpu_flush_commands (a runtime unit, checked by behaviour across calls).

Checks: flush_commands submits the batch so far, keeps later work ordered after it, and the batch goes on.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_flush(s, case.dims['n'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_flush_commands",
    cases=[
        Case('4099 bytes', {'n': 4099}),
        Case('1 MiB + 3 bytes', {'n': (1 << 20) + 3}),
    ],
    build=build,
    checks="flush_commands submits the batch so far, keeps later work ordered after it, and the batch goes on",
)
