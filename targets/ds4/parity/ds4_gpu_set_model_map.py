"""Scenario spec: ds4_gpu_set_model_map (a runtime unit, checked by behaviour across calls).

Checks: the mmapped GGUF registers (again too), ops read the right F16 rows and Q8_0 products through it; a NULL or empty map is refused.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng)
    rt.play_init(s)
    rt.play_set_model_map(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_set_model_map",
    cases=[
        Case('37x67 F16 embeddings, 96x256 Q8_0', {}),
    ],
    build=build,
    checks="the mmapped GGUF registers (again too), ops read the right F16 rows and Q8_0 products through it; a NULL or empty map is refused",
)
