"""`porter run` shows a progress bar on a terminal and only its plain lines in pipes and logs."""

from __future__ import annotations

import io

from rich.console import Console

from porter.run.progress import Reporter


def drive(console: Console, tmp_path, quiet: bool = False) -> tuple[str, str]:
    rep = Reporter(tmp_path / "run.log", quiet=quiet)
    rep.console = console
    bar = rep.progress(2, "porting")
    for unit in ("mini_gpu_init", "mini_gpu_add_tensor"):
        rep.line(f"[x] {unit}")
        bar.working_on(unit)
        bar.advance()
    rep.close()
    return console.file.getvalue(), (tmp_path / "run.log").read_text()


def test_a_terminal_gets_a_bar(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=True, width=100), tmp_path)
    assert "porting: mini_gpu_add_tensor" in shown and "2/2" in shown
    assert "━" in shown  # the bar itself
    assert "porting" not in log and log.count("[x]") == 2  # the log keeps plain lines only


def test_a_pipe_gets_plain_lines(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=False, width=100), tmp_path)
    assert shown.splitlines() == ["[x] mini_gpu_init", "[x] mini_gpu_add_tensor"]


def test_quiet_shows_nothing(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=True, width=100), tmp_path, quiet=True)
    assert shown == "" and log.count("[x]") == 2
