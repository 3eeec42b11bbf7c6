"""Scenario spec: ds4_gpu_tensor_contents (a runtime unit, checked by behaviour across calls).

Checks: contents(view) = contents(base) + offset (nested views add up, the pointer is stable, NULL for NULL); a managed tensor's contents are the host's view of its bytes.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_contents(s, case.dims['n'])
    rt.play_managed_host(s, case.dims['n'])
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_tensor_contents",
    cases=[
        Case('4099 bytes', {'n': 4099}),
    ],
    build=build,
    checks="contents(view) = contents(base) + offset (nested views add up, the pointer is stable, NULL for NULL); a managed tensor's contents are the host's view of its bytes",
)
