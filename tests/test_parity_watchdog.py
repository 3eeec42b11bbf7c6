"""The parity child's watchdog allows for the model maps a plan moves, and for nothing else: a plan whose
calls hang is still killed at the base limit when it maps little."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from porter.gates.parity.gate import DEFAULT_TIMEOUT_S, MAP_BYTES_PER_S, watchdog_s
from porter.spec import In, Map


def _case(map_bytes: int, timed: bool = False, sets: int = 3):
    def call():
        # a map of that size without allocating it (a broadcast view)
        return SimpleNamespace(args={"model_map": Map(np.broadcast_to(np.uint8(0), (map_bytes,))),
                                     "x": In(np.zeros(4, np.float32))})

    calls = [call(), call()]
    return SimpleNamespace(calls=calls, shape=SimpleNamespace(timed=timed, expect="ok"),
                           timing_sets=calls + [call() for _ in range(sets - 2)])


def test_a_plan_without_big_maps_keeps_the_base_limit():
    assert watchdog_s(DEFAULT_TIMEOUT_S, [_case(0), _case(4096, timed=True)], 10) < DEFAULT_TIMEOUT_S + 0.01


def test_a_multi_gb_map_plan_gets_time_for_its_traffic():
    # the routed-MoE shape: a 3.6 GB Q4_K case checked twice, and a timed 1.6 GB case with ten repetitions
    q4k, iq2 = 3_600_000_000, 1_600_000_000
    limit = watchdog_s(DEFAULT_TIMEOUT_S, [_case(q4k), _case(iq2, timed=True)], 10)
    expect = (4 * 2 * q4k + 4 * 2 * iq2 + 2 * 10 * iq2) / MAP_BYTES_PER_S
    assert abs(limit - (DEFAULT_TIMEOUT_S + expect)) < 1e-6 and limit > DEFAULT_TIMEOUT_S + 60


def test_untimed_runs_do_not_pay_for_repetitions():
    iq2 = 1_600_000_000
    assert watchdog_s(60.0, [_case(iq2, timed=True)], 0) == 60.0 + 8 * iq2 / MAP_BYTES_PER_S


def test_a_runtime_scenarios_runs_keep_the_base_limit():
    # a scenario's prepared runs have steps, not calls (the CI suite caught the first version reading .calls)
    assert watchdog_s(DEFAULT_TIMEOUT_S, [SimpleNamespace(steps=[])], 10) == DEFAULT_TIMEOUT_S
