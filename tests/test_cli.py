"""The command line: help a newcomer can follow, `porter init`, `porter units`, lazy wiring of other commands."""

from __future__ import annotations

import json
import sys
import types

import pytest

from porter import cli
from porter.records import gitops
from porter.target.placeholder import MARKER
from porter.target import load_target

COMMANDS = ["init", "run", "units", "dev", *cli.DELEGATED]


def test_top_level_help_lists_every_command_with_examples(porter_cli):
    r = porter_cli(None, "--help")
    assert r.returncode == 0
    for name in COMMANDS:
        assert f"\n    {name}" in r.stdout, name
    assert "examples:" in r.stdout and "porter init" in r.stdout and "porter run --provider scripted" in r.stdout
    assert "-C DIR" in r.stdout


def test_no_command_prints_help_and_exits_2(porter_cli):
    r = porter_cli(None)
    assert r.returncode == 2 and "commands" in r.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(porter_cli, name):
    r = porter_cli(None, name, "--help")
    assert r.returncode == 0, r.stderr
    assert f"porter {name}" in r.stdout
    if name in cli.READ_COMMANDS:
        assert "--json" in r.stdout, f"porter {name} has no --json"


def test_help_lists_every_developer_tool_with_one_line(porter_cli):
    for args in (("--help",), ("dev", "--help")):
        out = porter_cli(None, *args).stdout
        for name, (_, help_) in cli.DEV.items():
            assert f"  {name:<14}{help_}\n" in out, (args, name)


@pytest.mark.parametrize("name", cli.DEV)
def test_each_developer_tool_parses_its_own_options(capsys, name):
    with pytest.raises(SystemExit) as exc:
        cli.main(["dev", name, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: porter dev {name} ")


# Modules run as a script that are not developer tools: porter itself and the child processes it starts.
SCRIPTS_NOT_TOOLS = {"porter.cli", "porter.__main__", "porter.gates.parity.child", "porter.gates.parity.worker",
                     "porter.gates.parity.checker"}


def test_every_python_m_entry_point_is_a_porter_dev_tool():
    """A module runnable with `python -m` is listed under `porter dev` (one line in --help), so no
    developer entry point hides outside porter --help."""
    import ast
    from pathlib import Path

    root = Path(cli.__file__).resolve().parents[1]
    scripts = set()
    for p in (root / "porter").rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        guard = any(isinstance(n, ast.Compare) and ast.unparse(n) == "__name__ == '__main__'"
                    for n in ast.walk(ast.parse(p.read_text())))
        if guard or parts[-1] == "__main__":
            scripts.add(".".join(parts))
    assert "porter.bench.parity" in scripts  # the walk sees the guards
    tools = {module for module, _ in cli.DEV.values()}
    assert scripts - SCRIPTS_NOT_TOOLS == tools


def test_init_makes_a_workspace(workspace):
    ws = workspace
    assert (ws / ".git").is_dir() and (ws / "ledger" / "README.md").is_file()
    assert "runs/" in (ws / ".gitignore").read_text() and (ws / "runs").is_dir()
    assert gitops.git(ws, "status", "--porcelain").strip() == ""
    assert len(gitops.git(ws, "log", "--format=%H").split()) == 1
    tracked = gitops.git(ws, "ls-files").split()
    assert not [p for p in tracked if p.startswith("runs/")]
    target = load_target(ws, "minimoe")
    assert target.checkout == ws / "targets" / "minimoe"
    for unit in target.units:
        path = target.unit_path(unit)
        assert f"targets/minimoe/ported/{unit}.cu" in tracked
        text = path.read_text()
        assert text.splitlines()[0] == MARKER and f'extern "C"' in text and unit in text
    assert sorted(p.stem for p in target.ported_dir.glob("*.cu")) == sorted(target.units)


def test_units_lists_signatures_and_file_state(workspace, porter_cli):
    r = porter_cli(workspace, "units", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    target = load_target(workspace, "minimoe")
    assert data["target"] == "minimoe" and [u["unit"] for u in data["units"]] == target.units
    for u in data["units"]:
        fn = target.api_function(u["unit"])
        assert u["signature"] == fn.c_signature() and u["file_state"] == "placeholder" and u["state"] == "unported"
        assert u["kind"] == ("runtime" if u["unit"] in target.runtime_units else "op")
    assert sum(u["kind"] == "runtime" for u in data["units"]) == 10
    # a hand-written file is "written", and still unported: what it is worth is for the gates to say
    target.unit_path("mini_gpu_add_tensor").write_text('#include "mini_cuda.cuh"\n// real code here\n')
    data = json.loads(porter_cli(workspace, "units", "--json").stdout)
    add = {u["unit"]: u for u in data["units"]}["mini_gpu_add_tensor"]
    assert add["file_state"] == "written" and add["state"] == "unported"
    text = porter_cli(workspace, "units").stdout
    assert "int mini_gpu_attention_window_tensor(mini_gpu_tensor *out," in text and "24 units" in text


def test_workspace_is_found_from_a_subdirectory(workspace, porter_cli):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "porter", "units", "--json"], cwd=workspace / "targets" / "minimoe",
                       capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["target"] == "minimoe"


def test_delegated_commands_get_workspace_and_target(workspace, monkeypatch, capsys):
    seen = {}
    mod = types.ModuleType("porter_fake_plan")
    mod.add_arguments = lambda p: p.add_argument("--deep", action="store_true")
    mod.run = lambda args: seen.update(vars(args)) or 0
    monkeypatch.setitem(sys.modules, "porter_fake_plan", mod)
    monkeypatch.setitem(cli.DELEGATED, "plan", ("porter_fake_plan", "x"))
    assert cli.main(["-C", str(workspace), "plan", "--deep", "--json"]) == 0
    assert seen["workspace"] == workspace and seen["target"] == "minimoe"
    assert seen["deep"] is True and seen["json"] is True


def test_porter_errors_map_to_their_exit_code(workspace, monkeypatch, capsys):
    from porter.errors import PorterError

    mod = types.ModuleType("porter_fake_status")
    mod.add_arguments = lambda p: None

    def boom(args):
        raise PorterError("ledger chain broken at line 3", exit_code=3)

    mod.run = boom
    monkeypatch.setitem(sys.modules, "porter_fake_status", mod)
    monkeypatch.setitem(cli.DELEGATED, "status", ("porter_fake_status", "x"))
    assert cli.main(["-C", str(workspace), "status"]) == 3
    assert capsys.readouterr().err == "porter: error: ledger chain broken at line 3\n"
