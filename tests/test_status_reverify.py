"""`porter status --reverify` measures now instead of trusting the record.

The case it exists for: a unit recorded as built whose code no longer builds
because something under it changed (here the target's CUDA conventions header),
which recorded evidence alone cannot see.
"""

from __future__ import annotations

import json

from conftest import needs_nvcc

ADD = "mini_gpu_add_tensor"


@needs_nvcc
def test_reverify_contradicts_a_built_unit_whose_conventions_changed(workspace, build_cache, porter_cli):
    env = {"PORTER_PARITY": "off"}
    r = porter_cli(workspace, "run", "--target", "minimoe", "--provider", "scripted", "--unit", ADD, env=env)
    assert r.returncode == 0, r.stderr

    r = porter_cli(workspace, "status", "--reverify", "--json", env=env)
    assert r.returncode == 0, r.stderr
    fresh = {u["unit"]: u for u in json.loads(r.stdout)["reverify"]["units"]}
    assert fresh[ADD]["verdicts"] == ["static ok", "build ok", "parity skipped"] and fresh[ADD]["ok"] is True
    assert fresh["mini_gpu_swiglu_tensor"]["ok"] is None  # a placeholder has nothing to check

    header = workspace / "targets" / "minimoe" / "cuda" / "mini_cuda.cuh"
    header.write_text(header.read_text().replace("void    *data;", "void    *ptr;"))
    plain = porter_cli(workspace, "status", "--json", env=env)
    assert {u["unit"]: u["state"] for u in json.loads(plain.stdout)["units"]}[ADD] == "built"  # the record alone

    r = porter_cli(workspace, "status", "--reverify", env=env)
    assert r.returncode == 1
    assert "recorded state contradicted now: " + ADD in r.stdout
    assert "build REFUSED" in r.stdout
