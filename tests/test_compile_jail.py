"""porter/gates/compile_jail.py: what a compile or link of candidate code sees."""

import shutil
from pathlib import Path

import pytest

from porter.gates import compile_jail

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_a_tool_named_bare_shows_nothing_of_the_callers_folder(tmp_path, monkeypatch):
    """nvcc's dryrun names g++ bare: its folder is not where porter runs (a workspace, a checkout)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    jail = compile_jail.for_command(["g++", "-shared", "-o", str(tmp_path / "out" / "l.so"), "a.o"], tmp_path / "out")
    assert not [p for p in jail.ro if Path(tmp_path).is_relative_to(p) or Path(p).is_relative_to(tmp_path)], jail.ro
    assert jail.rw == (str((tmp_path / "out").resolve()),)


def test_the_compile_environment_holds_no_key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    monkeypatch.setenv("PORTER_SIGNING_KEY", "/somewhere/key")
    env = compile_jail.clean_env(TMPDIR="/x")
    assert "ANTHROPIC_API_KEY" not in env and "PORTER_SIGNING_KEY" not in env and env["TMPDIR"] == "/x"
