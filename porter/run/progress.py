"""`porter run`'s progress: plain lines (also in runs/<run>/run.log) and a bar on a terminal."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape


class Reporter:
    """Progress on the terminal (rich) and the same lines in runs/<run>/run.log."""

    def __init__(self, log_path: Path | None = None, quiet: bool = False):
        self.console = Console(highlight=False, soft_wrap=True)
        self.bar = None  # the run's progress bar, on a terminal only
        self.log_path = log_path
        self.quiet = quiet
        self._log = open(log_path, "a", buffering=1) if log_path else None
        self._lock = threading.Lock()  # --jobs N: lines from several units, never interleaved

    def line(self, text: str, style: str | None = None) -> None:
        with self._lock:
            self._line(text, style)

    def _line(self, text: str, style: str | None) -> None:
        if not self.quiet:
            self.console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
        if self._log:
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
            self._log.write(f"{stamp} {text}\n")

    def progress(self, total: int, what: str) -> "UnitBar":
        """A progress bar under the lines on a terminal; nothing extra in pipes and logs (the lines say it)."""
        self.bar = UnitBar(self.console if (self.console.is_terminal and not self.quiet) else None, total, what)
        return self.bar

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self._log:
            self._log.close()
            self._log = None


class UnitBar:
    """rich's Progress over the run's units: the current unit as its label; inert without a console."""

    def __init__(self, console: Console | None, total: int, what: str):
        self._p = None
        if console is None or total <= 0:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=console, transient=True)
        self._task = self._p.add_task(what, total=total)
        self._what = what
        self._p.start()

    def working_on(self, label: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=f"{self._what}: {label}")

    def advance(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
