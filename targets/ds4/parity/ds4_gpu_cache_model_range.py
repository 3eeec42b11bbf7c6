"""Scenario spec: ds4_gpu_cache_model_range (a runtime unit, checked by behaviour across calls).

Checks: cached tensor spans read back right through the map; ranges outside the map are refused; 0 bytes is a no-op.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng)
    rt.play_init(s)
    rt.play_cache_model_range(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_cache_model_range",
    cases=[
        Case('37x67 F16 embeddings, 96x256 Q8_0', {}),
    ],
    build=build,
    checks="cached tensor spans read back right through the map; ranges outside the map are refused; 0 bytes is a no-op",
)
