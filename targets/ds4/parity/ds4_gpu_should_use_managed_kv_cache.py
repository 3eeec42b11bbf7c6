"""Scenario spec: ds4_gpu_should_use_managed_kv_cache (a runtime unit, checked by behaviour across calls).

Checks: the managed-KV query answers 0 for empty and small caches.
The contract and the plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")


def build(case, ctx, rng):
    s = Script(rng)
    rt.play_init(s)
    rt.play_managed_kv(s)
    s.call("ds4_gpu_cleanup", expect="ok")  # the next case starts from a fresh backend, as a new engine does
    return s


SCENARIO = Scenario(
    unit="ds4_gpu_should_use_managed_kv_cache",
    cases=[
        Case('empty and small caches', {}),
    ],
    build=build,
    checks="the managed-KV query answers 0 for empty and small caches",
)
