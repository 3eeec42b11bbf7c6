"""Perf is judged in the regime the target runs in production: the target declares it ([perf] regime), the
parity harness loads the weights that way (its [harness.regimes] hook), and the evidence names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.gates.parity.gate import harness_names, in_regime
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]


def test_the_regime_picks_the_model_hook():
    h = {"model_ptr": "host_hook", "regimes": {"device": "copy_hook", "host": "host_hook"}}
    assert in_regime(h, "device")["model_ptr"] == "copy_hook"
    assert in_regime(h, "host")["model_ptr"] == "host_hook"
    with pytest.raises(ValueError, match="no model hook"):
        in_regime(h, "unified")
    one = {"model_ptr": "only_hook"}  # a harness with one hook serves the target's one regime
    assert in_regime(one, "device") == {"model_ptr": "only_hook", "regime": "device"}


def test_ds4_is_timed_with_its_weights_in_device_memory(tmp_path):
    """The failed-port verdict came from timing ds4 with its weights read over the host link: the target now
    declares the device regime, the host one only as a named comparison, and both libraries the parity
    child loads (porter's glue, the upstream calibration harness) define the device hook."""
    (tmp_path / "ds4_gpu.h").write_text("")  # no checkout needed: only our files are read
    target = load_target(REPO, "ds4", tmp_path)
    assert target.spec.perf.regime == "device" and target.spec.perf.regimes == ["host"]
    hook = in_regime(harness_names(target), "device")["model_ptr"]
    assert hook != harness_names(target)["model_ptr"]  # not the registered-host-map hook
    for src in ("cuda/ds4_cuda_glue.cu", "parity/upstream_harness.cu"):
        text = (target.dir / src).read_text()
        assert f'extern "C" const void *{hook}(' in text, src
    assert "DS4_CUDA_COPY_MODEL" in (target.dir / "parity" / "upstream_harness.cu").read_text()


def test_a_retime_runs_in_a_child_of_its_own_unless_the_plans_go_to_a_cluster(monkeypatch):
    from porter.gates.parity import executors, pool

    monkeypatch.delenv("PORTER_PARITY_EXECUTOR", raising=False)
    fresh = executors.fresh_executor("host")
    assert isinstance(fresh, pool.OnSlot) and fresh.pool is executors.executor("host")  # a child, on a pool slot
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "spawn")
    assert isinstance(executors.fresh_executor("host"), pool.SpawnExecutor)
    made = []
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "ray")
    monkeypatch.setattr(executors, "executor", lambda mode: made.append(mode) or "cluster")
    assert executors.fresh_executor("cuda") == "cluster" and made == ["cuda"]  # the orchestrator may have no GPU


def test_a_fresh_child_waits_for_the_gpu_slot_a_warm_plan_holds(monkeypatch, tmp_path):
    """Under --jobs N a re-time (or a sanitizer run, or a scenario) started beside the warm workers shared
    the GPU with another unit's timed calls: it now takes a slot of the same pool, on that slot's GPU."""
    import threading

    from porter.gates.parity import pool, runner

    started = threading.Event()
    seen = {}
    outcome = runner.ChildOutcome("done", 0, 0.01, "completed")

    def child(plan_dir, timeout, argv=None, env=None):
        seen.update(env=env, argv=argv)
        started.set()
        return outcome

    monkeypatch.setattr(runner, "run_child", child)
    p = pool.WarmPool("cuda", 1, [3])  # one slot, GPU 3; no worker is started until a plan comes
    held = p.free.get()  # a warm plan holds the slot
    got = []
    t = threading.Thread(target=lambda: got.append(pool.OnSlot(p, sanitize=True).run(tmp_path, 5.0)))
    t.start()
    assert not started.wait(0.3)  # not before the slot is free (a wait that cannot pass early, whatever the load)
    p.free.put(held)
    t.join(60)
    assert got == [outcome] and seen["env"] == {"CUDA_VISIBLE_DEVICES": "3"}
    assert outcome.waited_s >= 0.3  # the evidence says how long it queued (harness_s.waited_s)
    assert seen["argv"][0].endswith("compute-sanitizer") and p.free.qsize() == 1  # the slot is given back
