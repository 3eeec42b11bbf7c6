"""`porter dev e2e`: a scratch folder the command makes for itself is its own to remove (ds4's fixture
alone is 11.5 GB: a nightly run by hand filled /tmp), one the user names is theirs."""

from __future__ import annotations

import tempfile
from pathlib import Path

from porter.commands import e2e

REPO = Path(__file__).resolve().parents[1]


def _made(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("porter-e2e-minimoe-*"))


def test_the_scratch_it_made_is_removed_even_when_the_command_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert e2e.main(["no-such-command", "--target", "minimoe", "--workspace", str(REPO)]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err
    assert _made(tmp_path) == []


def test_keep_scratch_keeps_it_and_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert e2e.main(["no-such-command", "--target", "minimoe", "--workspace", str(REPO), "--keep-scratch"]) == 2
    kept = _made(tmp_path)
    assert len(kept) == 1 and f"scratch kept: {kept[0]}" in capsys.readouterr().err


def test_a_named_scratch_is_never_removed(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "fixture.gguf").write_bytes(b"x")
    assert e2e.main(["no-such-command", "--target", "minimoe", "--workspace", str(REPO), "--scratch", str(mine)]) == 2
    assert (mine / "fixture.gguf").is_file()
