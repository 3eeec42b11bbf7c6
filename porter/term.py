"""The console every table-printing command uses: as wide as the terminal, or as asked.

- `--wide`: no width limit, one line per row, nothing wrapped (for grep and wide screens);
- a terminal: its width (rich reads it, and COLUMNS where set);
- a pipe or log with COLUMNS set: that width, so `COLUMNS=80 porter status | less` fits 80;
- a pipe or log without COLUMNS: 200 columns, so a cron log keeps one unit per line.
"""

from __future__ import annotations

import os

from rich.console import Console

LOG_WIDTH = 200
WIDE = 100_000


def console(wide: bool = False, file=None) -> Console:
    if wide:
        return Console(width=WIDE, file=file, highlight=False, soft_wrap=True)
    con = Console(file=file, highlight=False)
    if not con.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        con.width = LOG_WIDTH
    return con


def add_wide_argument(parser) -> None:
    parser.add_argument("--wide", action="store_true", help="never wrap: one line per row, whatever the terminal width")
