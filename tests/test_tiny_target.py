"""docs/adding-a-target.md, followed for a third target of our own (tests/data/tinytarget: two units
behind a Metal backend): `porter init --target DIR` -> plan -> run (scripted) -> status, with no edit
of porter/.  Without a GPU the parity gate cannot run, so the units end `built`, never `verified`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from porter.gates import parity
from porter.spec import load_specs
from porter.target import load_target
from porter.workspace import init_workspace

TINY = Path(__file__).resolve().parent / "data" / "tinytarget"
UNITS = ["tiny_gpu_scale_tensor", "tiny_gpu_add_tensor"]


def test_its_parity_specs_load_and_match_the_header(tmp_path):
    ws = init_workspace(tmp_path / "ws", [str(TINY)])
    target = load_target(ws, "tinytarget")
    assert target.units == UNITS
    specs = load_specs(target)  # each spec is checked against tiny_gpu.h's signature as it loads
    assert sorted(specs) == sorted(UNITS)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: porter run's build gate needs it")
def test_init_plan_run_status(tmp_path, build_cache, porter_cli):
    ws = tmp_path / "ws"
    init = porter_cli(None, "init", str(ws), "--target", str(TINY))
    assert init.returncode == 0, init.stdout + init.stderr
    assert (ws / "targets" / "tinytarget" / "target.toml").is_file()

    plan = porter_cli(ws, "plan", "--json")
    assert plan.returncode == 0, plan.stderr
    ranked = json.loads(plan.stdout)["units"]
    assert [(u["unit"], u["tier"]) for u in ranked] == [(u, "prefill") for u in UNITS]

    run = porter_cli(ws, "run", "--provider", "scripted", "--max-attempts", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "static REFUSED" in run.stdout  # the scripted stub was refused before the good answer landed

    status = porter_cli(ws, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    states = {u["unit"]: u["state"] for u in json.loads(status.stdout)["units"]}
    if not parity.available()[0]:
        assert states == {u: "built" for u in UNITS}, states
    else:
        assert all(s.startswith("verified") for s in states.values()) and sorted(states) == sorted(UNITS), states
