"""Shared fixtures: fresh workspaces, the porter CLI as a subprocess, one nvcc object cache.

- `workspace`: `porter init` into tmp_path/ws (minimoe, every unit a placeholder).
- `porter_cli(ws, *args, env=None)`: runs `python -m porter -C ws ...`, returns CompletedProcess.
- `build_cache`: one content-addressed object cache for the whole session
  ($PORTER_BUILD_CACHE), so each placeholder / glue object is compiled once
  per session instead of once per workspace.
- `needs_nvcc`: skip marker (with its reason) for tests that run the real nvcc.
- a git identity (GIT_AUTHOR_*/GIT_COMMITTER_*) for every commit of the session: none of the user's is needed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Tests commit with git directly (and through gitpython): an identity of their own for the whole session,
# so the suite runs where the user has none (an empty HOME in CI, a fresh container).
for _var, _value in (("GIT_AUTHOR_NAME", "porter-test"), ("GIT_AUTHOR_EMAIL", "porter-test@localhost"),
                     ("GIT_COMMITTER_NAME", "porter-test"), ("GIT_COMMITTER_EMAIL", "porter-test@localhost")):
    os.environ.setdefault(_var, _value)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: the build gate needs the CUDA toolkit")


# Why a ds4 test skipped, and how to stop it skipping: ds4 is an input, never part of this repository.
NO_DS4 = ("no ds4 checkout: git clone https://github.com/antirez/ds4 external/ds4 "
          "(or set PORTER_DS4_SOURCE to a clone)")


def ds4_checkout() -> Path | None:
    """The user's ds4 checkout: $PORTER_DS4_SOURCE, else external/ds4 (git-ignored); None without one."""
    for c in (os.environ.get("PORTER_DS4_SOURCE"), REPO / "external" / "ds4"):
        if c and (Path(c) / "ds4_cuda.cu").is_file():
            return Path(c).resolve()
    return None


def spec_module(target, unit: str):
    """The module a unit's spec file was loaded as, once load_spec has run: its helpers (F, M, ...) live
    there.  Not spec.build's module: a helper beside the specs may wrap build (ds4's _null_guards does)."""
    path = (Path(target.dir) / "parity" / f"{unit}.py").resolve()
    return next(m for m in list(sys.modules.values())
                if isinstance(getattr(m, "__file__", None), str) and Path(m.__file__).resolve() == path)


@pytest.fixture(autouse=True)
def _porter_home(monkeypatch, tmp_path):
    """Signing keys, trust pins and witnesses of every test live in tmp, never in ~/.config/porter."""
    for var in ("PORTER_SIGNING_KEY", "PORTER_TRUSTED_KEYS", "PORTER_WITNESS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PORTER_HOME", str(tmp_path / "porter-home"))


def show_if_verbose(config, lines: list[str]) -> bool:
    """A test's table for whoever asked for detail (-v): under -q it would land in the middle of the
    progress dots (mini_cpu.c's 126 lines did). Returns whether it was shown."""
    if config.get_verbosity() < 1:
        return False
    tr = config.pluginmanager.getplugin("terminalreporter")
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        for line in lines:
            (tr.write_line(line) if tr else print(line))
    return True


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    if os.environ.get("PORTER_BUILD_CACHE"):
        return Path(os.environ["PORTER_BUILD_CACHE"])
    d = tmp_path_factory.mktemp("build-cache")
    os.environ["PORTER_BUILD_CACHE"] = str(d)
    return d


def make_workspace(path: Path) -> Path:
    from porter.workspace import init_workspace

    return init_workspace(path, ["minimoe"])


@pytest.fixture
def workspace(tmp_path) -> Path:
    return make_workspace(tmp_path / "ws")


def _run_porter(ws: Path | None, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("COLUMNS", "200")
    # the porter of this tree, not whichever one is installed (the command runs in the workspace)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "porter"]
    if ws is not None:
        cmd += ["-C", str(ws)]
    cmd += [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=str(ws or REPO))


@pytest.fixture
def porter_cli():
    return _run_porter


@pytest.fixture(scope="module")
def porter_cli_module():
    return _run_porter


def gates_with(**modules):
    """The registry's gates with some modules replaced by stand-ins, for monkeypatch.setattr(registry, "ACTIVE", ...)."""
    from dataclasses import replace

    from porter.gates import registry

    return tuple(replace(g, module=modules.get(g.name, g.module)) for g in registry.ACTIVE)


# ---- the suite leaves the repository as it found it -------------------------------------------------
# Tests write under tmp_path only: a launch trace once landed in the repository's root and was committed.
# Checked where nobody edits the tree meanwhile (CI, or PORTER_TREE_CHECK=1): a developer's edits during a
# local run would read as the suite's.

def tree_changes(repo: Path, before: str | None) -> list[str]:
    """`git status --porcelain` lines of `repo` that were not there `before` (None: git could not say)."""
    now = _tree_state(repo)
    if before is None or now is None:
        return []
    return sorted(set(now.splitlines()) - set(before.splitlines()))


def _tree_state(repo: Path) -> str | None:
    r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, capture_output=True,
                       text=True)
    return r.stdout if r.returncode == 0 else None


def _tree_check_on() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("PORTER_TREE_CHECK") == "1"


def pytest_sessionstart(session):
    session.config._porter_tree = _tree_state(REPO) if _tree_check_on() else None


def pytest_sessionfinish(session, exitstatus):
    changed = tree_changes(REPO, getattr(session.config, "_porter_tree", None))
    if changed:
        sys.stderr.write("the test suite changed the repository (tests write under tmp_path only):\n  "
                         + "\n  ".join(changed) + "\n")
        session.exitstatus = 1
