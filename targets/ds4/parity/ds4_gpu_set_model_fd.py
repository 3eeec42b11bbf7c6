"""Scenario spec: ds4_gpu_set_model_fd (a runtime unit, checked by behaviour across calls).

Checks: after set_model_fd (the file's fd, then -1) ops still read the right bytes through the map.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng)
    rt.play_init(s)
    rt.play_set_model_fd(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_set_model_fd",
    cases=[
        Case('37x67 F16 embeddings, 96x256 Q8_0', {}),
    ],
    build=build,
    checks="after set_model_fd (the file's fd, then -1) ops still read the right bytes through the map",
)
