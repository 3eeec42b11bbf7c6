"""Builds target the GPU that runs them (porter/host/arch.py): named, else detected, else the target's default."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import needs_nvcc
from porter.host import arch
from porter.errors import PorterError
from porter.gates import build
from porter.target import load_target


@pytest.fixture(autouse=True)
def _no_named_arch(monkeypatch):
    monkeypatch.delenv(arch.ENV, raising=False)
    monkeypatch.delenv(arch.REQUIRE_ENV, raising=False)


def test_names_are_read_in_every_usual_spelling():
    assert [arch.normalize(a) for a in ("sm_120", "120", "12.0", "SM_121", "9.0", "sm_90a")] == \
        ["sm_120", "sm_120", "sm_120", "sm_121", "sm_90", "sm_90a"]
    assert arch.normalize("compute_90") == "compute_90"  # PTX only: kept as such
    assert arch.number("sm_120") == 120 and arch.number("compute_90") == 90
    for bad in ("hopper", "sm_", "sm_9", "1.2.3"):
        with pytest.raises(PorterError, match="not understood"):
            arch.normalize(bad)


def test_named_beats_detected_beats_the_default(monkeypatch):
    assert arch.choose("sm_90", found=()) == arch.ArchChoice(("sm_90",), "default")
    assert arch.choose("sm_90", found=("sm_120",)) == arch.ArchChoice(("sm_120",), "detected")
    assert arch.choose("sm_90", "sm_121", found=("sm_120",)) == arch.ArchChoice(("sm_121",), "named")
    monkeypatch.setenv(arch.ENV, "12.0,sm_90,sm_120")
    assert arch.choose("sm_80", found=("sm_100",)) == arch.ArchChoice(("sm_120", "sm_90"), "named")


def test_one_arch_is_arch_several_are_one_gencode_each():
    assert arch.nvcc_flags(("sm_90",)) == ["-arch=sm_90"]
    assert arch.nvcc_flags(("sm_90", "sm_120")) == ["-gencode", "arch=compute_90,code=sm_90",
                                                    "-gencode", "arch=compute_120,code=sm_120"]


def test_detection_reads_nvidia_smi_when_cupy_is_absent(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '12.0\\n9.0\\n12.0\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(arch, "_from_cupy", lambda: None)
    arch.detected.cache_clear()
    try:
        assert arch.detected() == ("sm_90", "sm_120")  # every kind of GPU here, once each
    finally:
        arch.detected.cache_clear()


def _copy_target(workspace: Path, edit) -> None:
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(edit(toml.read_text()))


def test_a_target_that_fixes_the_arch_in_its_flags_is_refused(workspace):
    _copy_target(workspace, lambda t: t.replace('"-fPIC"]', '"-fPIC", "-arch=sm_90"]'))
    with pytest.raises(PorterError, match="nvcc_flags fixes the architecture .*declare default_arch"):
        load_target(workspace, "minimoe")


def test_the_targets_build_flags_and_cache_keys_follow_the_gpu(workspace, monkeypatch):
    monkeypatch.setattr(arch, "detected", lambda: ())
    cpu_only = load_target(workspace, "minimoe")
    assert cpu_only.arch.how == "default" and cpu_only.nvcc_flags[-1] == "-arch=sm_90"
    monkeypatch.setattr(arch, "detected", lambda: ("sm_120",))
    rtx = load_target(workspace, "minimoe")
    assert rtx.arch == arch.ArchChoice(("sm_120",), "detected") and "-arch=sm_120" in build.compile_flags(rtx)
    # an object for one GPU is never taken from the cache for another
    assert build.object_key(rtx, b"x") != build.object_key(cpu_only, b"x")


@needs_nvcc
@pytest.mark.skipif(shutil.which("objcopy") is None, reason="objcopy (binutils) reads the object's fatbin")
def test_a_named_arch_is_what_the_object_holds_and_the_evidence_says(workspace, build_cache, monkeypatch, tmp_path):
    from porter.gates.driver import Candidate, GateContext, run_gates

    monkeypatch.setenv(arch.ENV, "sm_120")
    target = load_target(workspace, "minimoe")
    unit = "mini_gpu_tensor_bytes"
    src = ('#include "mini_cuda.cuh"\n__global__ static void k(int *p) { *p = 1; }\n'
           'extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *t) { return t ? t->bytes : 0; }\n')
    obj, _, _ = build.compile_object(target, unit, src.encode(), build_cache)
    fatbin = tmp_path / "fatbin"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(fatbin)], check=True)
    assert set(re.findall(rb"sm_\d+", fatbin.read_bytes())) == {b"sm_120"}  # its cubin and PTX are sm_120's
    # the evidence of a build names the architectures (a refused one too: cheaper than linking them all)
    broken = src.replace("return t ?", "return t ?? ")
    res = run_gates(Candidate.of(unit, broken), GateContext(target, workspace), gates=("build",))[-1]
    assert not res.ok and res.check == "compile"
    assert res.evidence["arch"] == ["sm_120"] and res.evidence["arch_from"] == "named"
    assert "-arch=sm_120" in res.evidence["nvcc_flags"]


def test_arch_on_the_command_line_is_what_every_build_of_the_command_uses(workspace, porter_cli):
    r = porter_cli(workspace, "doctor", "--arch", "12.0", env={arch.ENV: ""})
    line = next(line for line in r.stdout.splitlines() if line.split()[1:2] == ["arch"])
    assert "builds for sm_120 (named by --arch" in line
    bad = porter_cli(workspace, "doctor", "--arch", "hopper")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "porter: error: GPU architecture 'hopper' not understood: name it like sm_90, sm_120 or 12.0"]


# ---- required architectures (issue 32): verdicts on several GPU kinds ----

def test_required_archs_are_validated_and_ordered(monkeypatch):
    monkeypatch.delenv(arch.REQUIRE_ENV, raising=False)
    assert arch.required(["sm_121", "9.0"]) == ("sm_90", "sm_121")
    assert arch.required([], named="sm_121,sm_90,sm_121") == ("sm_90", "sm_121")
    monkeypatch.setenv(arch.REQUIRE_ENV, "sm_120")
    assert arch.required(["sm_90"]) == ("sm_90", "sm_120")
    with pytest.raises(PorterError, match=r"^GPU architecture 'sm121' not understood") as bad:
        arch.required(["sm121"])
    assert "\n" not in str(bad.value)
    with pytest.raises(PorterError, match="virtual .*require a GPU kind"):
        arch.required(["compute_90"])


def test_a_target_requiring_archs_builds_for_each_of_them(workspace, monkeypatch):
    monkeypatch.delenv(arch.REQUIRE_ENV, raising=False)
    monkeypatch.setattr(arch, "detected", lambda: ("sm_90",))
    _copy_target(workspace, lambda t: t.replace('default_arch = ', 'required_archs = ["sm_121", "sm_90"]\ndefault_arch = '))
    target = load_target(workspace, "minimoe")
    assert target.required_archs == ("sm_90", "sm_121")
    assert target.arch.archs == ("sm_90", "sm_121")
    assert "code=sm_121" in " ".join(build.compile_flags(target))
    monkeypatch.setenv(arch.REQUIRE_ENV, "sm_120")  # --require-arch adds to the target's
    assert load_target(workspace, "minimoe").arch.archs == ("sm_90", "sm_120", "sm_121")


def test_a_target_requiring_a_bad_arch_name_is_refused_in_one_line(workspace):
    _copy_target(workspace, lambda t: t.replace('default_arch = ', 'required_archs = ["hopper"]\ndefault_arch = '))
    with pytest.raises(PorterError, match="required_archs: .*'hopper' not understood") as bad:
        load_target(workspace, "minimoe")
    assert "\n" not in str(bad.value)


def test_require_arch_on_the_command_line_refuses_a_bad_name_in_one_line(workspace, porter_cli):
    bad = porter_cli(workspace, "status", "--require-arch", "sm_90", "--require-arch", "hopper")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "porter: error: GPU architecture 'hopper' not understood: name it like sm_90, sm_120 or 12.0"]


@needs_nvcc
def test_the_build_gate_fails_when_one_required_arch_does_not_build(workspace, build_cache, monkeypatch):
    """One fat library for every required architecture: a unit that compiles for sm_90 but not for sm_121
    is refused by the build gate when sm_121 is required, and passes where only sm_90 is."""
    from porter.gates.driver import Candidate, GateContext, run_gates

    unit = "mini_gpu_tensor_bytes"
    src = ('#include "mini_cuda.cuh"\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200\n'
           '#error "this kernel was written for sm_90 only"\n#endif\n'
           '__global__ static void k(int *p) { *p = 1; }\n'
           'extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *t) { return t ? t->bytes : 0; }\n')
    monkeypatch.setattr(arch, "detected", lambda: ())
    monkeypatch.setenv(arch.REQUIRE_ENV, "sm_90")
    ok = run_gates(Candidate.of(unit, src), GateContext(load_target(workspace, "minimoe"), workspace,
                                                        build_cache), gates=("build",))[-1]
    assert ok.ok, ok.summary
    monkeypatch.setenv(arch.REQUIRE_ENV, "sm_90,sm_121")
    res = run_gates(Candidate.of(unit, src), GateContext(load_target(workspace, "minimoe"), workspace,
                                                         build_cache), gates=("build",))[-1]
    assert not res.ok and res.check == "compile" and "sm_90 only" in (res.summary + res.diagnostics)
    assert res.evidence["arch"] == ["sm_90", "sm_121"]


def _parity_on(arch_seen, ok=True):
    from porter.gates.result import GateResult

    return GateResult("parity", ok, "parity ok" if ok else "parity failed [values]: case 3: nmse 0.4",
                      check=None if ok else "values",
                      evidence={"gate": "parity", "ok": ok, "toolchain": {"arch": arch_seen}})


def test_parity_across_required_archs_refuses_on_the_one_that_fails():
    from porter.gates import archs

    res = archs.across(("sm_90", "sm_121"), ("sm_90", "sm_121"), lambda a: _parity_on(a, ok=a != "sm_121"), gate="parity")
    assert not res.ok and not res.skipped and res.check == "values"
    assert res.summary.startswith("[sm_121] parity failed") and "failing on sm_121; passed on sm_90" in res.summary
    assert archs.verdicts(res.evidence) == {"sm_90": True, "sm_121": False}


def test_parity_across_required_archs_never_takes_one_kind_for_another():
    """A worker placed as sm_121 whose child saw an sm_90 GPU gives no verdict on sm_121; a kind no
    reachable GPU has is not measured; with none measured the gate is skipped, never passed."""
    from porter.gates import archs

    res = archs.across(("sm_90", "sm_121"), ("sm_90", "sm_121"), lambda a: _parity_on("sm_90"), gate="parity")
    assert archs.verdicts(res.evidence) == {"sm_90": True}
    assert "sm_121 not measured: parity skipped: placed on sm_121 but the run saw sm_90" in res.summary
    only_90 = archs.across(("sm_90", "sm_121"), ("sm_90",), _parity_on, gate="parity")
    # passing where it ran, yet no pass: the run commits it built, never verified
    assert not only_90.ok and only_90.skipped and archs.verdicts(only_90.evidence) == {"sm_90": True}
    assert "sm_121 not measured: no GPU of sm_121 reachable (GPUs here: sm_90)" in only_90.summary
    none = archs.across(("sm_121",), (), _parity_on, gate="parity")
    assert none.skipped and not none.ok and archs.verdicts(none.evidence) == {}
