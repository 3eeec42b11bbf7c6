"""Scenario spec: ds4_gpu_cache_q8_f16_range (a runtime unit, checked by behaviour across calls).

Checks: matmuls after the F16 expansion of a Q8_0 range match a numpy decode of its blocks; a range outside the map is refused.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    m = rt.Model(ctx, rng, in_dim=case.dims['in_dim'], out_dim=case.dims['out_dim'])
    rt.play_init(s)
    rt.play_cache_q8_f16(s, m)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_cache_q8_f16_range",
    cases=[
        Case('96x256 Q8_0 (shared-expert label)', {'in_dim': 256, 'out_dim': 96}),
        Case("512x4096 Q8_0 (attn_kv's real size)", {'in_dim': 4096, 'out_dim': 512}),
    ],
    build=build,
    checks="matmuls after the F16 expansion of a Q8_0 range match a numpy decode of its blocks; a range outside the map is refused",
)
