"""Toolchain facts are asked in one module (porter/host/toolchain.py), once per process and tool."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from porter.host import toolchain

REPO = Path(__file__).resolve().parent.parent


def version_askers(root: Path) -> list[str]:
    """Python modules under root/porter whose code holds "--version" in a list or tuple literal: an argv
    asking a tool its version (porter's own `--version` option is an add_argument string, not an argv)."""
    def asks(tree) -> bool:
        return any(isinstance(n, (ast.List, ast.Tuple)) and any(isinstance(e, ast.Constant) and e.value == "--version"
                                                                for e in n.elts) for n in ast.walk(tree))
    return sorted(str(p.relative_to(root)) for p in (root / "porter").rglob("*.py") if asks(ast.parse(p.read_text())))


def test_only_the_toolchain_module_asks_a_tool_its_version(tmp_path):
    assert version_askers(REPO) == ["porter/host/toolchain.py"]
    (tmp_path / "porter").mkdir()
    (tmp_path / "porter" / "build.py").write_text('import subprocess\nsubprocess.run(["nvcc", "--version"])\n')
    assert version_askers(tmp_path) == ["porter/build.py"]  # the walk sees a second asker


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """An nvcc on PATH that counts how often it is asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "asked"
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho x >> {count}\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    "echo 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    toolchain.version_output.cache_clear()
    yield nvcc, count
    toolchain.version_output.cache_clear()


def test_nvcc_is_asked_once_for_both_views_of_its_version(fake_nvcc):
    nvcc, count = fake_nvcc
    # the build gate's view (evidence and object cache key) and parity's (evidence): the same values as before
    assert toolchain.nvcc_release_line(str(nvcc)) == "Cuda compilation tools, release 12.4, V12.4.131"
    assert toolchain.nvcc_version() == "release 12.4, V12.4.131"
    toolchain.nvcc_release_line(str(nvcc))  # asked again: answered from the cache
    assert count.read_text().count("x") == 1


def test_evidence_toolchain_of_a_host_stand_in_names_no_driver(monkeypatch):
    monkeypatch.setattr(toolchain, "driver_facts", lambda: pytest.fail("nvidia-smi asked in host mode"))
    facts = toolchain.device_facts({"name": "host stand-in"}, "host")
    assert facts["gpu"] == "host stand-in" and facts["driver"] is None
    assert set(facts) == {"nvcc", "gpu", "driver", "driver_api_version", "cuda_runtime", "cupy", "python", "numpy",
                          "arch", "host", "executor"}
    assert facts["host"] and facts["executor"] == "local" and facts["arch"] is None


def test_a_verdict_reached_on_another_host_names_that_hosts_gpu_driver_and_architecture(monkeypatch):
    """--executor ray: the run happened on a worker host; its own nvidia-smi's answer (sent back by
    the harness there) is the evidence, never this machine's."""
    monkeypatch.setattr(toolchain, "driver_facts", lambda: {"gpu": "orchestrator's GPU", "driver": "1.0"})
    where = {"host": "spark-2", "executor": "ray", "gpu": "NVIDIA GB10", "driver": "580.95"}
    facts = toolchain.device_facts({"name": "NVIDIA GB10", "compute_capability": "12.1"}, "cuda", where)
    assert (facts["host"], facts["executor"], facts["gpu"], facts["driver"], facts["arch"]) == \
        ("spark-2", "ray", "NVIDIA GB10", "580.95", "sm_121")
    here = toolchain.device_facts({"compute_capability": "9.0"}, "cuda")
    assert (here["gpu"], here["driver"], here["arch"], here["executor"]) == ("orchestrator's GPU", "1.0", "sm_90", "local")
