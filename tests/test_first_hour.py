"""A new user's first hour (issue 43): what went wrong the first time someone followed the README.

- starting over at the same path (`rm -rf` and the README's block again) is a new workspace, not a
  rollback; a ledger replaced under an existing workspace still is one;
- porter's own source checkout (or any repository `porter init` did not make) is never written to;
- the suite commits with git without a git identity of the user's;
- exhausted units are listed by the next run with how to retry them;
- doctor anywhere, target.toml typos with "did you mean", a unit in progress, a new workspace's
  witness line, ds4's ledger line at 100 columns.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from conftest import REPO, needs_nvcc
from porter import cli
from porter.records import signing
from porter.commands import status as status_mod
from porter.records.lock import RunLock
from porter.commands.status import StatusReport, UnitStatus, derive, render, tamper_check
from porter.target import load_target
from porter.workspace import init_workspace
from ws_builder import SOURCES, TARGET, Workspace, make_workspace

SWIGLU = "mini_gpu_swiglu_tensor"


def _ported(root: Path) -> Workspace:
    """`root` from `porter init`, one unit ported through the Ledger API (signed: the witness sees it)."""
    w = Workspace(root, None, signing.load_private(root))
    w.repo.git.config("user.name", "porter-test")
    w.repo.git.config("user.email", "porter-test@localhost")
    w.port(SWIGLU)
    return w


# ---- 1. starting over at the same path ------------------------------------------------------------


def test_a_new_workspace_at_a_path_used_before_is_not_a_rollback(tmp_path, capsys):
    path = tmp_path / "porter-demo"
    _ported(init_workspace(path, [TARGET]))
    shutil.rmtree(path)  # the README's "start over"
    ws = init_workspace(path, [TARGET])
    assert tamper_check(ws, load_target(ws, TARGET), None) is None  # `porter run` would start
    report = derive(ws, TARGET)
    assert report.exit_code == 0 and report.counts["tampered"] == 0 and not report.ledger["rolled_back"]
    _ported(ws)  # and its own first records are witnessed from then on
    assert derive(ws, TARGET).exit_code == 0


def test_a_ledger_replaced_under_an_existing_workspace_is_still_a_rollback(tmp_path):
    ws = init_workspace(tmp_path / "ws", [TARGET])
    _ported(ws)
    (ws / "ledger" / "ledger.jsonl").write_text("")  # the ledger started over, without `porter init`
    subprocess.run(["git", "-C", str(ws), "commit", "-qam", "a clean slate"], check=True)
    found = tamper_check(ws, load_target(ws, TARGET), None)
    assert found is not None and found[0] == "rolled back" and "ledger replaced or emptied" in found[1]


# ---- 2. a repository porter did not make ----------------------------------------------------------


def _source_clone(tmp_path: Path) -> Path:
    """What a fresh clone of porter looks like to find_workspace: targets/, ledger/, porter/, pyproject."""
    clone = tmp_path / "porter-clone"
    shutil.copytree(REPO / "targets" / TARGET, clone / "targets" / TARGET,
                    ignore=shutil.ignore_patterns("ported", "__pycache__", "*.o", "*.so"))
    (clone / "ledger").mkdir()
    (clone / "ledger" / "README.md").write_text("ledger\n")
    (clone / "porter").mkdir()
    (clone / "porter" / "__init__.py").write_text("")
    shutil.copy(REPO / "pyproject.toml", clone / "pyproject.toml")
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(clone), "commit", "-qm", "porter"], check=True)
    return clone


def _head(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("command", [["run", "--provider", "scripted"], ["optimize"],
                                     ["repair", "--reason", "x"], ["calibrate", "--target", TARGET]])
def test_porters_own_source_checkout_is_never_written_to(tmp_path, capsys, command):
    clone = _source_clone(tmp_path)
    head = _head(clone)
    assert cli.main(["-C", str(clone), *command]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "porter's own source checkout, not a workspace" in err[0] and "porter init" in err[0]
    assert _head(clone) == head and not (clone / "ledger" / "ledger.jsonl").exists()


def test_this_checkout_is_refused_too(capsys):
    from porter.workspace import not_made_by_porter

    assert "porter's own source checkout" in (not_made_by_porter(REPO) or "")
    # safe: the command stops on that reason before anything is read from the provider or written
    assert cli.main(["-C", str(REPO), "run", "--target", TARGET, "--provider", "scripted"]) == 2
    assert "porter's own source checkout" in capsys.readouterr().err


def test_a_repository_init_did_not_make_is_refused(tmp_path, capsys):
    ws = init_workspace(tmp_path / "ws", [TARGET])
    shutil.rmtree(ws / ".git")
    (ws / ".porter-workspace").unlink()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run(["git", "-C", str(ws), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(ws), "commit", "-qm", "my own repository"], check=True)
    assert cli.main(["-C", str(ws), "run", "--provider", "scripted"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not made by `porter init`" in err[0]


def test_init_marks_its_workspace_and_a_workspace_from_before_the_mark_still_runs(tmp_path):
    from porter.workspace import not_made_by_porter

    ws = init_workspace(tmp_path / "ws", [TARGET])
    assert (ws / ".porter-workspace").is_file() and not_made_by_porter(ws) is None
    assert ".porter-workspace" in subprocess.run(["git", "-C", str(ws), "ls-files"], capture_output=True,
                                                 text=True).stdout  # committed: a clone of it is one too
    (ws / ".porter-workspace").unlink()  # made by an older porter: its first commit says so
    assert not_made_by_porter(ws) is None
    assert not_made_by_porter(make_workspace(tmp_path / "built").root) is None  # the tests' own builder


def test_init_over_porters_source_checkout_is_refused(tmp_path, capsys):
    clone = _source_clone(tmp_path)
    assert cli.main(["init", str(clone)]) == 2
    assert "porter's own source checkout" in capsys.readouterr().err


# ---- 3. no git identity needed ------------------------------------------------------------------


def test_the_suite_commits_without_a_git_identity_of_the_users(tmp_path):
    home = tmp_path / "empty-home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home), GIT_CONFIG_NOSYSTEM="1",
               GIT_CONFIG_GLOBAL=os.devnull)
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True, env=env)
    (tmp_path / "r" / "f").write_text("x")
    subprocess.run(["git", "-C", str(tmp_path / "r"), "add", "f"], check=True, env=env)
    r = subprocess.run(["git", "-C", str(tmp_path / "r"), "commit", "-qm", "c"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr


# ---- 4. exhausted units -------------------------------------------------------------------------


@needs_nvcc
def test_the_next_run_lists_exhausted_units_and_how_to_retry_them(tmp_path, capsys, build_cache):
    ws = make_workspace(tmp_path / "ws", signer=signing.create_private())
    last = ws.target.units[-1]
    for u in ws.target.units[:-1]:
        ws.port(u, source=SOURCES.get(u, f'#include "mini_cuda.cuh"\n// {u}, ported\n'))
    for n in (1, 2, 3):
        ws.fail(last, n)
    ws.exhaust(last, 3)
    ws.commit_all("exhausted")
    assert cli.main(["-C", str(ws.root), "run", "--provider", "scripted"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 unit(s) to port" in out
    assert f"1 unit exhausted earlier, not retried: {last}" in out
    assert f"porter run --unit {last}" in out


def test_max_attempts_says_what_it_does(porter_cli):
    text = " ".join(porter_cli(None, "run", "--help").stdout.split())
    assert "in this run (default 3)" not in text
    assert "--max-attempts N attempts per unit before it is exhausted (default 3)" in text
    assert "later runs skip an exhausted unit" in text and "--unit" in text


# ---- 5. smaller ---------------------------------------------------------------------------------


def test_doctor_outside_a_workspace_checks_the_machine_and_says_what_it_cannot(tmp_path, porter_cli):
    r = porter_cli(None, "-C", str(tmp_path), "doctor")
    lines = r.stdout.splitlines()
    assert "Traceback" not in r.stderr and not r.stderr.strip(), r.stderr
    assert not any(line.startswith("FAIL target") for line in lines), r.stdout
    first = lines[0]
    assert first.startswith("note workspace") and "no workspace here" in first and "-C DIR" in first
    assert " sandbox " in r.stdout and " nvcc " in r.stdout
    failing = [line for line in lines if line.startswith("FAIL")]
    assert r.returncode == (2 if failing else 0), r.stdout


def test_doctor_in_a_workspace_of_several_targets_checks_the_machine(tmp_path, porter_cli):
    ws = init_workspace(tmp_path / "ws", [TARGET])
    shutil.copytree(ws / "targets" / TARGET, ws / "targets" / "other")
    toml = ws / "targets" / "other" / "target.toml"
    toml.write_text(toml.read_text().replace('name = "minimoe"', 'name = "other"'))
    r = porter_cli(ws, "doctor")
    assert "several targets" not in r.stderr, r.stderr
    assert "pass --target NAME" in r.stdout and " sandbox " in r.stdout


def _user_target(tmp_path: Path, old: str, new: str) -> Path:
    folder = tmp_path / "mytarget"
    shutil.copytree(REPO / "targets" / TARGET, folder, ignore=shutil.ignore_patterns("ported", "__pycache__"))
    toml = folder / "target.toml"
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new))
    return folder


def test_a_misspelled_required_key_says_did_you_mean_and_names_the_users_file(tmp_path, capsys):
    folder = _user_target(tmp_path, 'api_header = "mini_gpu.h"', 'api_heder = "mini_gpu.h"')
    assert cli.main(["init", str(tmp_path / "ws"), "--target", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(folder / "target.toml") in err[0] and str(tmp_path / "ws") not in err[0]
    assert "source.api_heder" in err[0] and "did you mean api_header?" in err[0]


def test_a_misspelled_optional_key_is_one_clear_line(tmp_path, capsys):
    folder = _user_target(tmp_path, "nvcc_flags = ", "nvcc_flag = ")
    assert cli.main(["init", str(tmp_path / "ws"), "--target", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Extra inputs are not permitted" not in err[0], err
    assert "cuda.nvcc_flag is not a key of [cuda]" in err[0] and "did you mean nvcc_flags?" in err[0]


def test_a_typo_in_a_workspaces_own_copy_is_named_there(workspace, capsys):
    toml = workspace / "targets" / TARGET / "target.toml"
    toml.write_text(toml.read_text().replace('engine = "engine.c"', 'engin = "engine.c"'))
    assert cli.main(["-C", str(workspace), "units"]) == 2
    err = capsys.readouterr().err
    assert str(toml) in err and "did you mean engine?" in err


def test_status_during_a_run_says_in_progress_not_failing(tmp_path, capsys):
    ws = make_workspace(tmp_path / "ws", signer=signing.create_private())
    ws.fail("mini_gpu_add_tensor", 1)
    ws.attempt("mini_gpu_add_tensor", 2, "// answer being judged\n")  # a verdict not recorded yet
    ws.attempt(SWIGLU, 1, "// answer being judged\n")
    holder = subprocess.Popen(["python3", "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR "
                               "| os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(60)", str(ws.root / "runs" / "porter.records.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        report = derive(ws.root, TARGET)
        add, swiglu = report.unit("mini_gpu_add_tensor"), report.unit(SWIGLU)
        assert add.label == swiglu.label == "in progress" and "attempt 2 in progress" in add.reason
        buf = io.StringIO()
        render(report, Console(file=buf, width=120))
        said = " ".join(buf.getvalue().split())
        assert "units (24): 2 in progress, 22 unported" in said
    finally:
        holder.kill()
        holder.wait()
    after = derive(ws.root, TARGET)  # the run is gone: an attempt without a verdict was interrupted
    assert after.unit(SWIGLU).state == "failing" and after.unit(SWIGLU).label != "in progress"
    assert RunLock(ws.root).acquire()


def test_a_new_workspaces_status_does_not_open_with_an_alarm(workspace):
    buf = io.StringIO()
    render(derive(workspace, TARGET), Console(file=buf, width=100))
    text = buf.getvalue()
    assert "a rollback cannot be seen here" not in text
    assert not text.startswith("witness:")


def _ledger_report(target: str) -> StatusReport:
    fp = "SHA256:fG3yOI268Aq4rlglsVZPwHm7SI80fcrR7pfftlQZdp8"
    units = [UnitStatus(unit=f"{target}_gpu_unit_{i}", state="unported", reason="placeholder, no attempt")
             for i in range(3)]
    counts = {s: 0 for s in status_mod.STATES} | {"unported": 3, "total": 3}
    return StatusReport(target=target, units=units, counts=counts,
                        critical_path={"available": False, "reason": "not ranked", "tiers": [], "units": [],
                                       "counts": None},
                        ledger={"ok": True, "records": 0, "key": f"signed (Ed25519 {fp}), not pinned: "
                                f"`porter trust {fp}`", "problems": [], "witness": {"state": "none"}})


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_ledger_line_wraps_between_phrases(width):
    buf = io.StringIO()
    render(_ledger_report("ds4"), Console(file=buf, width=width))
    lines = buf.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ledger:"))
    block = [lines[start]] + [line for line in lines[start + 1:] if line.startswith("  ")]
    assert all(len(line) <= width for line in block), block
    for phrase in ("0 records", "chain ok", "signed (Ed25519 SHA256:fG3yOI268Aq4rlglsVZPwHm7SI80fcrR7pfftlQZdp8)",
                   "not pinned: `porter trust SHA256:fG3yOI268Aq4rlglsVZPwHm7SI80fcrR7pfftlQZdp8`"):
        assert any(phrase in line for line in block), (phrase, block)


# -- item 5: the guide covers what a new engine needs, and what it says is enforced -----------------------

def test_a_target_whose_name_is_not_its_folders_is_one_line(workspace, capsys):
    toml = workspace / "targets" / TARGET / "target.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TARGET}"', 'name = "renamed"', 1))
    for command in (["units"], ["plan"], ["doctor", "--target", TARGET]):
        rc = cli.main(["-C", str(workspace), *command])
        err = capsys.readouterr()
        assert rc == 2, command
        text = err.err if command[0] != "doctor" else err.out
        assert f"name is 'renamed' but the folder is '{TARGET}'" in text, (command, text)
        if command[0] != "doctor":
            assert len(err.err.strip().splitlines()) == 1, err.err


def test_the_guide_says_what_a_new_engine_needs():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "adding-a-target.md").read_text()
    for needed in ("SCENARIO = Scenario(", "runtime unit",  # runtime units need a scenario spec
                   'expect="error"', "`expect` is empty",  # what an error case's build() returns
                   "porter doctor", "misspelling",  # a misspelled kernel name, flagged by default
                   "the folder is",  # the name/folder rule, and that it is enforced
                   "edit that copy afterwards"):  # edits after init go to the workspace's copy
        assert needed in guide, needed
