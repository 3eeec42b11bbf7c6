"""Scenario spec: mini_gpu_cleanup (a runtime unit, checked by behaviour across calls).

Checks: work enqueued before mini_gpu_cleanup() is complete when it returns; init after cleanup starts the
backend again; cleanup releases what the backend holds for the model maps handed to ops before it.

The last is an engine loading models one after another, each between init and cleanup: a backend that keeps
its device copy of a map past cleanup holds one more per model (and would serve stale weights to a new map
mmapped at a freed address).  That case calls mini_gpu_embed_rows_tensor, the plainest op that reads a map,
so `uses` names it: parity judges cleanup once that op is ported (scheduler.verify_deferred).
The plays are in _runtime.py; the scenario kind in porter/gates/parity/scenario.py."""
from porter.spec.scenario import Case, Scenario, Script
from porter.spec import sibling

rt = sibling(__file__, "_runtime")

MiB = 1 << 20


def build(case, ctx, rng):
    s = Script(rng)
    if 'models' in case.dims:
        rt.play_models_after_cleanup(s, ctx, case.dims['models'], case.dims['map_bytes'])
        return s
    rt.play_init(s)
    rt.play_ordering(s, case.dims['n'], 'cleanup')
    rt.play_roundtrip(s, 1031)
    return s


SCENARIO = Scenario(
    unit="mini_gpu_cleanup",
    cases=[
        Case('copy of 65537 bytes queued behind a busy stream, then cleanup', {'n': 65537}),
        Case('8 models of 8 MiB + 4099 bytes, one after another, each released by cleanup',
             {'models': 8, 'map_bytes': 8 * MiB + 4099}),
    ],
    build=build,
    checks="work enqueued before mini_gpu_cleanup() is complete when it returns; init after cleanup starts the "
           "backend again; cleanup releases the device copies of the model maps handed to ops before it",
    # every other unit the cases call (scenario_uses builds case 0 only, which reads no map)
    uses=("mini_gpu_init", "mini_gpu_synchronize", "mini_gpu_tensor_alloc", "mini_gpu_tensor_write",
          "mini_gpu_tensor_read", "mini_gpu_tensor_copy", "mini_gpu_tensor_free", "mini_gpu_embed_rows_tensor"),
)
