"""Running the README's first block twice: `porter init` on the workspace it made keeps it as it is."""

from __future__ import annotations

import git

from porter.cli import main


def test_init_on_its_own_workspace_is_a_no_op(workspace, capsys):
    head = git.Repo(workspace).head.commit.hexsha
    (workspace / "runs" / "mine.txt").write_text("work in progress")
    assert main(["init", str(workspace)]) == 0
    said = capsys.readouterr().out
    assert "already a workspace with target minimoe; left as it is" in said and "status" in said
    assert git.Repo(workspace).head.commit.hexsha == head
    assert (workspace / "runs" / "mine.txt").read_text() == "work in progress"


def test_init_of_another_target_over_a_workspace_is_still_refused(workspace, capsys):
    assert main(["init", str(workspace), "--target", "ds4"]) == 2
    assert "is not empty" in capsys.readouterr().err
