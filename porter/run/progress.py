"""`porter run`'s progress: plain lines (also in runs/<run>/run.log) and a bar on a terminal."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from porter.term import Steps


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

    def progress(self, total: int, what: str) -> Steps:
        """A progress bar under the lines on a terminal; nothing extra in pipes and logs (the lines say it)."""
        self.bar = Steps(what, total, console=None if self.quiet else self.console)
        return self.bar

    def steps(self, what: str, total: int) -> Steps:
        """Progress of a long job inside the run (the first build of every placeholder object): a row
        under the run's bar on a terminal; in pipes and run.log, a plain line every tenth of it."""
        return Steps(what, total, console=None if self.quiet else self.console, plain=self.line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self._log:
            self._log.close()
            self._log = None
