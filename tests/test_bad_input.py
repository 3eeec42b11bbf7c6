"""Bad input: each is a one-line error (or a one-line refusal in the ledger), a non-zero exit,
and a ledger that is unchanged (errors before the run) or intact (refused answers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from porter.records.ledger import Ledger

HAVE_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not on PATH: porter run needs the CUDA toolkit")
UNIT = "mini_gpu_add_tensor"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, build_cache, porter_cli_module):
    """A workspace whose ledger already holds a committed step (so 'unchanged' means something)."""
    from porter.workspace import init_workspace

    ws = init_workspace(tmp_path_factory.mktemp("bad") / "ws", ["minimoe"])
    if HAVE_NVCC:
        r = porter_cli_module(ws, "run", "--unit", UNIT)
        assert r.returncode == 0, r.stdout + r.stderr
    return ws


def one_line_error(r, *needles: str, code: int = 2) -> str:
    assert r.returncode == code, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{r.stderr}"
    assert lines[0].startswith("porter: error: "), lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def snapshot(ws: Path) -> tuple[bytes, str]:
    from porter.records import gitops

    return Ledger(ws).read_bytes(), gitops.git(ws, "rev-parse", "HEAD")


@pytest.fixture
def unchanged(seeded):
    before = snapshot(seeded)
    yield seeded
    assert snapshot(seeded) == before, "a refused command changed the ledger or made a commit"
    assert Ledger(seeded).verify().ok


def test_malformed_target_toml(unchanged, porter_cli):
    toml = unchanged / "targets" / "minimoe" / "target.toml"
    original = toml.read_text()
    try:
        toml.write_text(original.replace('name = "minimoe"', 'name = "minimoe'))
        one_line_error(porter_cli(unchanged, "run"), "malformed", "target.toml")
        toml.write_text(original + "\n[cuda.extra]\nx = 1\n")
        one_line_error(porter_cli(unchanged, "run"), "malformed", "cuda")
        toml.write_text(original.replace('library = "libmini_cuda.so"', ""))
        one_line_error(porter_cli(unchanged, "units"), "malformed", "library")
    finally:
        toml.write_text(original)


def test_missing_source_checkout(unchanged, porter_cli, tmp_path):
    one_line_error(porter_cli(unchanged, "run", "--source", str(tmp_path / "nope")), "does not exist")
    one_line_error(porter_cli(unchanged, "run", "--source", str(tmp_path)), "has no mini_gpu.h")


def test_unknown_unit(unchanged, porter_cli):
    one_line_error(porter_cli(unchanged, "run", "--unit", "mini_gpu_teleport_tensor"), "unknown unit", "porter units")


def test_unknown_target_and_provider(unchanged, porter_cli):
    one_line_error(porter_cli(unchanged, "run", "--target", "ds9"), "no target 'ds9'")
    if HAVE_NVCC:
        one_line_error(porter_cli(unchanged, "run", "--provider", "oracle"), "unknown provider 'oracle'")


def test_bad_option_values(unchanged, porter_cli):
    one_line_error(porter_cli(unchanged, "run", "--time-budget", "soon"), "--time-budget")
    one_line_error(porter_cli(unchanged, "run", "--max-attempts", "0"), "--max-attempts")


def test_no_nvcc_on_path(unchanged, porter_cli, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("git"), bin_dir / "git")  # git, but no nvcc
    line = one_line_error(porter_cli(unchanged, "run", env={"PATH": str(bin_dir)}), "nvcc not found on PATH")
    assert "CUDA toolkit" in line


@needs_nvcc
def test_a_target_without_its_cuda_conventions_cannot_run(unchanged, porter_cli):
    header = unchanged / "targets" / "minimoe" / "cuda" / "mini_cuda.cuh"
    original = header.read_bytes()
    header.unlink()
    try:
        one_line_error(porter_cli(unchanged, "run"), "no CUDA conventions header", "cuda/mini_cuda.cuh")
    finally:
        header.write_bytes(original)


def test_not_a_workspace(tmp_path, porter_cli):
    one_line_error(porter_cli(tmp_path, "units"), "not a porter workspace")
    one_line_error(porter_cli(None, "-C", str(tmp_path / "missing"), "status"), "no such directory")


def test_init_refuses_a_non_empty_directory(tmp_path, porter_cli):
    (tmp_path / "x").write_text("keep me")
    one_line_error(porter_cli(None, "init", str(tmp_path)), "not empty")
    assert (tmp_path / "x").read_text() == "keep me"
    one_line_error(porter_cli(None, "init", str(tmp_path / "w"), "--target", "ds9"), "no bundled target 'ds9'")
    assert not (tmp_path / "w").exists()


# ---- answers that hold no usable code: refused, recorded, the run exits 1 ----


def scripted_workspace(ws: Path, text: str) -> None:
    d = ws / "targets" / "minimoe" / "scripted"
    (d / "custom.md").write_text(text)
    (d / "manifest.toml").write_text(
        f'[[answer]]\nunit = "{UNIT}"\nfile = "custom.md"\nexpect = "extract"\nwhy = "test"\n'
    )


def refused_answer(ws: Path, porter_cli, text: str) -> dict:
    scripted_workspace(ws, text)
    r = porter_cli(ws, "run", "--unit", UNIT, "--max-attempts", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    ledger = Ledger(ws)
    assert ledger.verify().ok
    records = ledger.records()
    (failure,) = [x for x in records if x["kind"] == "failure"]
    assert failure["gate"] == "extract" and "\n" not in failure["summary"]
    assert [x["kind"] for x in records][-1] == "exhausted"
    assert not [x for x in records if x["kind"] == "step"]
    assert (ws / "targets/minimoe/ported" / f"{UNIT}.cu").read_text().startswith("// porter:placeholder")
    return failure


@needs_nvcc
def test_an_answer_with_no_code(workspace, build_cache, porter_cli):
    f = refused_answer(workspace, porter_cli, "Sure! I would write a kernel that adds a and b elementwise.")
    assert "no fenced code block" in f["summary"]


@needs_nvcc
def test_an_answer_with_two_definitions(workspace, build_cache, porter_cli):
    fn = ('extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, '
          "const mini_gpu_tensor *b, uint64_t n) { return cudaMemsetAsync(out->data, 0, n, mini_cuda_stream()); }\n")
    f = refused_answer(workspace, porter_cli, f"Two versions:\n```cuda\n{fn}\n{fn}```\n")
    assert "defines mini_gpu_add_tensor 2 times" in f["summary"]


@needs_nvcc
def test_exhausted_scripted_answers_stop_the_run_with_one_line(workspace, build_cache, porter_cli):
    scripted_workspace(workspace, "prose only")
    porter_cli(workspace, "run", "--unit", UNIT, "--max-attempts", "1")
    before = Ledger(workspace).read_bytes()
    r = porter_cli(workspace, "run", "--unit", UNIT, "--max-attempts", "1")
    assert r.returncode == 1
    assert f"scripted answers for {UNIT} exhausted" in r.stdout
    assert Ledger(workspace).read_bytes() == before
