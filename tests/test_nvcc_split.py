"""nvcc's steps split into a host and a device chain (porter/gates/nvcc_split.py), with real nvcc."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from porter.gates import build, compile_jail, nvcc_split
from porter.target import load_target


@pytest.fixture(autouse=True)
def _porter_home_beside(tmp_path_factory, monkeypatch):
    """These tests compile in tmp_path itself; the compiler's sandbox refuses a folder holding $PORTER_HOME."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path_factory.mktemp("porter-home")))

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: the split compile runs nvcc's own steps")

UNIT = "mini_gpu_add_tensor"
SOURCE = '''#include "mini_cuda.cuh"
namespace {
__device__ float twice(float x) { return 2.0f * x; }
}
static __global__ void add_kernel(float *o, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = twice(a[i]) + b[i];
}
extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, const mini_gpu_tensor *b, uint64_t n) {
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
}
'''


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from porter.workspace import init_workspace

    return load_target(init_workspace(tmp_path_factory.mktemp("split") / "ws", ["minimoe"]), "minimoe")


def _cmd(target, out: Path, name: str = f"{UNIT}.cu") -> list[str]:
    return [build.nvcc_path(), "-c", *build.compile_flags(target), "-o", str(out), name]


def _defined(obj: Path) -> set[str]:
    out = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _tu(tmp_path: Path, src: str = SOURCE) -> Path:
    (tmp_path / f"{UNIT}.cu").write_text(src)
    return tmp_path


def test_the_one_architecture_compile_is_split(target, tmp_path):
    """The shape porter's targets compile (-c, one -arch) must be recognised, or every build
    silently pays plain nvcc's serial steps."""
    p = nvcc_split.plan(_cmd(target, tmp_path / "x.o"), _tu(tmp_path))
    assert p is not None, "nvcc --dryrun no longer reads as the steps nvcc_split knows"
    assert [nvcc_split.tool_name(c) for c in p.host] == ["gcc", "cudafe++"]
    assert [nvcc_split.tool_name(c) for c in p.device] == ["gcc", "cicc", "ptxas", "fatbinary"]
    assert "--gen_module_id_file" not in p.host[1]
    assert p.module_id_file.startswith(str(p.tmpdir)), "nvcc's temporaries must be private to this compile"
    shutil.rmtree(p.tmpdir)


def test_split_object_matches_plain_nvcc_and_carries_our_module_id(target, tmp_path):
    tu = _tu(tmp_path)
    key = uuid.uuid4().hex * 2
    steps: dict[str, float] = {}
    assert nvcc_split.compile_split(_cmd(target, tmp_path / "split.o"), tu, key, UNIT, 120, step_ms=steps) == "ok"
    # every step that made the object has its time, under its chain: the bench's compile split
    assert {"plan", "host:gcc", "host:cudafe++", "device:gcc", "device:cicc", "device:ptxas",
            "device:fatbinary", "final:gcc"} <= set(steps), steps
    assert all(v > 0 for k, v in steps.items() if k != "plan"), steps
    subprocess.run(_cmd(target, tmp_path / "plain.o"), cwd=tu, check=True, capture_output=True)
    split, plain = _defined(tmp_path / "split.o"), _defined(tmp_path / "plain.o")
    # the anonymous namespace is named after the module id: ours in the split object
    ns = lambda syms: {s for s in syms if "_GLOBAL__N_" in s}  # noqa: E731
    assert any(key[:8] in s for s in ns(split)), sorted(ns(split))
    strip = lambda syms: {s for s in syms if "_GLOBAL__N_" not in s}  # noqa: E731
    assert strip(split) == strip(plain) and UNIT in split
    assert not list(tu.glob(".nvcc-split-*")), "the split compile left its temporaries behind"


def test_several_architectures_run_plain_nvcc(target, tmp_path):
    flags = [f for f in build.compile_flags(target) if not f.startswith("-arch")]
    cmd = [build.nvcc_path(), "-c", *flags, "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_80,code=sm_80", "-o", str(tmp_path / "x.o"), f"{UNIT}.cu"]
    assert nvcc_split.compile_split(cmd, _tu(tmp_path), "0" * 64, UNIT, 120) == "unsplit"
    assert not (tmp_path / "x.o").exists() and not list(tmp_path.glob(".nvcc-split-*"))


def test_a_failing_step_is_reported_failed_and_nvcc_gives_the_diagnostics(target, tmp_path):
    tu = _tu(tmp_path, SOURCE.replace("twice(a[i])", "twice(missing_name[i])"))
    assert nvcc_split.compile_split(_cmd(target, tmp_path / "x.o"), tu, "1" * 64, UNIT, 120) == "failed"
    with pytest.raises(build.CompileFailure) as exc:
        build.compile_object(target, UNIT, (tu / f"{UNIT}.cu").read_bytes(), tmp_path / "cache")
    assert 'identifier "missing_name" is undefined' in exc.value.output
    assert exc.value.output.count('"missing_name" is undefined') == 1, "one compiler's messages, once"


def test_a_device_only_error_fails_the_split(target, tmp_path):
    """cicc alone sees device code errors that the host chain accepts (here: a host function
    called from a kernel): the device chain's failure must not be lost to the host's success."""
    src = SOURCE.replace("namespace {", "float host_only(float x) { return x; }\nnamespace {").replace(
        "twice(a[i])", "host_only(a[i])")
    tu = _tu(tmp_path, src)
    assert nvcc_split.compile_split(_cmd(target, tmp_path / "x.o"), tu, "2" * 64, UNIT, 120) == "failed"


def test_a_compile_past_its_time_is_a_timeout(target, tmp_path):
    assert nvcc_split.compile_split(_cmd(target, tmp_path / "x.o"), _tu(tmp_path), "3" * 64, UNIT, 0.05) == "timeout"
    assert not list(tmp_path.glob(".nvcc-split-*"))


def test_concurrent_split_compiles_keep_their_temporaries_apart(target, tmp_path):
    def one(i: int):
        d = tmp_path / f"t{i}"
        d.mkdir()
        src = SOURCE.replace("2.0f * x", f"{i + 2}.0f * x")
        return nvcc_split.compile_split(_cmd(target, d / "x.o"), _tu(d, src), f"{i:064x}", UNIT, 180), d

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(4)))
    assert [r for r, _ in results] == ["ok"] * 4
    assert len({(d / "x.o").read_bytes() for _, d in results}) == 4


def _pid_free(steps: list[str]) -> list[str]:
    import re

    return [re.sub(r"tmpxft_[0-9a-f]+_", "tmpxft_<pid>_", s) for s in steps]


def test_a_remembered_dryrun_is_what_nvcc_would_list(target, tmp_path, monkeypatch):
    """nvcc is asked once per command shape; a later compile in another folder, to another output,
    with another private TMPDIR gets exactly the steps nvcc itself would list for it (only the
    temporaries' pid differs), and its environment lines."""
    monkeypatch.setattr(nvcc_split, "_DRYRUNS", {})
    asked = []
    real = nvcc_split.dryrun
    monkeypatch.setattr(nvcc_split, "dryrun", lambda *a, **k: asked.append(a[0]) or real(*a, **k))
    dirs = [tmp_path / "a" / "tu", tmp_path / "bb" / "tu2"]
    for d in dirs:
        d.mkdir(parents=True)
        _tu(d)
    plans = [nvcc_split.plan(_cmd(target, d / f"out{i}.o"), d) for i, d in enumerate(dirs)]
    assert len(asked) == 1 and all(plans)
    second = plans[1]
    env = compile_jail.clean_env(TMPDIR=str(second.tmpdir))
    fresh = real(_cmd(target, dirs[1] / "out1.o"), env, dirs[1])
    assert _pid_free([*second.host[:1], *second.device, second.final]) == _pid_free(
        [fresh[0], *fresh[2:6], fresh[-1]])
    assert all(str(dirs[0]) not in s for s in [*second.host, *second.device, second.final])
    assert {k: v for k, v in env.items() if k != "TMPDIR"} == {k: v for k, v in second.env.items() if k != "TMPDIR"}
    for p in plans:
        shutil.rmtree(p.tmpdir)
    # a compile the remembered listing serves makes the same object as plain nvcc
    assert nvcc_split.compile_split(_cmd(target, dirs[1] / "split.o"), dirs[1], "4" * 64, UNIT, 120) == "ok"
    assert len(asked) == 1
    subprocess.run(_cmd(target, dirs[1] / "plain.o"), cwd=dirs[1], check=True, capture_output=True)
    strip = lambda syms: {s for s in syms if "_GLOBAL__N_" not in s}  # noqa: E731
    assert strip(_defined(dirs[1] / "split.o")) == strip(_defined(dirs[1] / "plain.o"))
