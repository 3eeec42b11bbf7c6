"""`porter doctor`: one line per check with what to do; a required failure exits 2; no secret printed."""

from __future__ import annotations

import json
import sys
import types

import pytest

from conftest import needs_nvcc
from porter.host import arch
from porter.commands import doctor

SECRET = "sk-ant-api03-" + "Qx7" * 20


def _checks(ws, **kw) -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.checks(ws, "minimoe", **kw)}


@needs_nvcc
def test_every_check_is_one_line_and_a_ready_machine_exits_0(workspace, porter_cli):
    r = porter_cli(workspace, "doctor")
    lines = r.stdout.strip().splitlines()
    names = [line.split()[1] for line in lines[:-1]]
    for name in ("target", "nvcc", "libraries", "gpu", "arch", "cupy", "sandbox", "signing", "witness", "provider"):
        assert name in names, r.stdout
    required_failing = [line for line in lines if line.startswith("FAIL")]
    assert r.returncode == (2 if required_failing else 0), r.stdout
    assert all(" -> " in line for line in lines if line.startswith(("FAIL", "warn")))  # each says what to do


@needs_nvcc
def test_a_missing_toolkit_header_is_a_required_failure(workspace, porter_cli):
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text().replace('link_flags = ["-shared", "-lcudart"]',
                                             'link_flags = ["-shared", "-lcudart", "-lporter_no_such_lib"]\n'
                                             'toolkit_headers = ["cuda_runtime.h", "porter_no_such.h"]'))
    r = porter_cli(workspace, "doctor", "--json")
    assert r.returncode == 2
    got = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert not got["headers"]["ok"] and "porter_no_such.h" in got["headers"]["detail"]
    assert "cuda_runtime.h" not in got["headers"]["detail"]  # the toolkit has that one
    assert not got["libraries"]["ok"] and "libporter_no_such_lib.so" in got["libraries"]["detail"]
    assert got["headers"]["required"] and got["headers"]["todo"]


def test_the_provider_key_is_reported_present_never_printed(workspace, porter_cli, monkeypatch):
    r = porter_cli(workspace, "doctor", "--provider", "anthropic", env={"ANTHROPIC_API_KEY": SECRET})
    assert SECRET not in r.stdout + r.stderr and SECRET[:20] not in r.stdout
    line = next(line for line in r.stdout.splitlines() if " provider " in line)
    assert line.startswith("ok") and "$ANTHROPIC_API_KEY" in line
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    missing = _checks(workspace, provider={"provider": "anthropic"})["provider"]
    assert not missing.ok and missing.required and "export ANTHROPIC_API_KEY" in missing.todo


def test_a_named_arch_that_misses_this_machines_gpu_fails(workspace, monkeypatch):
    monkeypatch.setattr(arch, "detected", lambda: ("sm_90",))
    monkeypatch.setenv(arch.ENV, "sm_120")
    c = _checks(workspace)["arch"]
    assert not c.ok and c.required and "sm_90" in c.todo  # parity here could not load an sm_120-only build
    monkeypatch.setenv(arch.ENV, "sm_90,sm_120")
    assert _checks(workspace)["arch"].ok
    monkeypatch.setenv(arch.ENV, "sm_120")
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "ray")  # the cluster's workers load the builds, not this GPU
    assert _checks(workspace)["arch"].ok


def test_cupy_on_another_cuda_major_than_nvcc_is_said(monkeypatch):
    fake = types.SimpleNamespace(__version__="13.6.0", cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(runtimeGetVersion=lambda: 12080)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    bad = doctor._cupy("Cuda compilation tools, release 13.0, V13.0.88")
    assert not bad.ok and "cupy-cuda13x" in bad.todo and "CUDA 12" in bad.detail
    assert doctor._cupy("Cuda compilation tools, release 12.8, V12.8.1").ok


def test_a_signed_workspace_without_its_key_is_a_required_failure(workspace, monkeypatch, tmp_path):
    monkeypatch.setenv("PORTER_HOME", str(tmp_path / "another-home"))
    c = _checks(workspace)["signing key"]
    assert not c.ok and c.required and "PORTER_HOME" in c.todo


def test_outside_a_workspace_the_machine_is_still_checked(tmp_path, porter_cli):
    """No workspace is no failure: the machine's checks run, and a note says what needs a workspace."""
    r = porter_cli(None, "-C", str(tmp_path), "doctor")
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    assert " ".join(lines[0].split()).startswith("note workspace no workspace here") and " sandbox " in r.stdout
    assert r.returncode == (2 if any(line.startswith("FAIL") for line in lines) else 0)
    assert not {"signing", "provider", "headers"} & {line.split()[1] for line in lines[:-1]}  # a workspace's checks


def _gpu_here() -> str | None:
    try:
        import cupy

        p = cupy.cuda.runtime.getDeviceProperties(0)
        return f"sm_{p['major']}{p['minor']}"
    except Exception:  # noqa: BLE001 - no cupy, driver or device
        return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_here() is None, reason="needs an NVIDIA GPU and cupy: the GPU, its architecture and driver")
def test_on_a_gpu_machine_builds_are_for_its_gpu(workspace, porter_cli, monkeypatch):
    monkeypatch.delenv(arch.ENV, raising=False)
    arch.detected.cache_clear()
    r = porter_cli(workspace, "doctor", env={arch.ENV: ""})
    print(r.stdout)  # the integrator pastes this into the note
    got = {line.split()[1]: line for line in r.stdout.splitlines()[:-1]}
    assert got["gpu"].startswith("ok") and _gpu_here() in got["gpu"] and "driver" in got["gpu"]
    assert got["arch"].startswith("ok") and f"builds for {_gpu_here()} (the GPUs of this machine)" in got["arch"]
    assert got["cupy"].startswith("ok"), got["cupy"]
