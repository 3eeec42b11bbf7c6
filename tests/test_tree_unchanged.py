"""The suite's own check that it leaves the repository as it found it (conftest.pytest_sessionfinish)."""

from __future__ import annotations

import subprocess

from conftest import _tree_state, tree_changes


def test_a_file_a_test_left_behind_is_named(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "kept.txt").write_text("x")
    subprocess.run(["git", "-C", str(repo), "add", "kept.txt"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "x"], check=True)
    (repo / "dirty_before.txt").write_text("a developer's file")
    before = _tree_state(repo)
    assert tree_changes(repo, before) == []  # nothing new yet
    (repo / "launch.trace").write_text("left by a test")
    (repo / "kept.txt").write_text("rewritten by a test")
    assert tree_changes(repo, before) == [" M kept.txt", "?? launch.trace"]
    assert tree_changes(repo, None) == []  # no record of before: nothing claimed
