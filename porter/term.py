"""The console every table-printing command uses, and the one table layout they share.

Width:
- `--wide`: no width limit, one line per row, nothing wrapped (for grep and wide screens);
- a terminal: its width (rich reads it, and COLUMNS where set);
- a pipe or log with COLUMNS set: that width, so `COLUMNS=80 porter status | less` fits 80;
- a pipe or log without COLUMNS: 200 columns, so a cron log keeps one unit per line.

Layout (`Table`): fixed columns (a unit's name, its tier, state, counts: never wrapped, since a
broken name or number misleads) and one *tail* (the reason, the notes) that takes the width left.
A tail squeezed below a readable width is not wrapped letter by letter: the layout gives way in
this order, keeping one line per row as long as it can:
  1. every column, the tail beside them;
  2. the columns marked `give_way` left out (a commit id, which --json and audit also show);
  3. every column on the row's line, the tail on its own lines under it;
  4. the same without the `give_way` columns (with one space between columns if only that fits);
  5. stacked: the key column (the unit) alone on the first line, the other columns under it,
     then the tail.
A new column (a speed figure, say) is one more `Column` in the list: the layout needs no change.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

LOG_WIDTH = 200
WIDE = 100_000
TAIL_MIN = 30  # narrowest a reason column may be: below it, the reason goes under its row
INDENT = "  "
GAP = "  "
NARROW_GAP = " "
UNDER = "      "  # a reason or the stacked columns, under the unit they belong to


def console(wide: bool = False, file=None) -> Console:
    if wide:
        return Console(width=WIDE, file=file, highlight=False, soft_wrap=True)
    con = Console(file=file, highlight=False)
    if not con.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        con.width = LOG_WIDTH
    return con


def width(wide: bool = False) -> int | None:
    """The width a plain-text table should fit: None (no limit) with --wide, else the console's rule."""
    return None if wide else console().width


def add_wide_argument(parser) -> None:
    parser.add_argument("--wide", action="store_true", help="never wrap: one line per row, whatever the terminal width")


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers line up on the right
    give_way: bool = False  # left out before the tail goes under its row
    key: bool = False  # what a row is about (the unit): first on its own line when stacked


_WRAP = Console(file=io.StringIO(), width=WIDE)  # Text.wrap needs a console; only its defaults are read


def _rstripped(t: Text) -> Text:
    t = t.copy()
    t.rstrip()
    return t


def _text(cell) -> Text:
    return cell.copy() if isinstance(cell, Text) else Text(str(cell))


class Table:
    def __init__(self, columns: list[Column], tail: str | None = None, title: str | None = None,
                 rule: bool = True, tail_style: str | None = "dim"):
        self.columns = list(columns)
        self.tail, self.title, self.rule, self.tail_style = tail, title, rule, tail_style
        self.rows: list[tuple[list[Text], Text] | None] = []  # None: a section break
        self.key = next((i for i, c in enumerate(self.columns) if c.key), 0)

    def add_row(self, *cells, tail="") -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(([_text(c) for c in cells], _text(tail)))

    def add_section(self) -> None:
        if self.rows and self.rows[-1] is not None:
            self.rows.append(None)

    # ---- layout ----------------------------------------------------------------------------

    def _header(self, i: int, mode: str) -> str:
        """A tail under its row is announced in the key column's header ("unit / reason")."""
        col = self.columns[i]
        return f"{col.header} / {self.tail}" if self.tail and i == self.key and mode != "beside" else col.header

    def _widths(self, cols: list[int], mode: str = "beside") -> list[int]:
        rows = [r for r in self.rows if r is not None]
        return [max([cell_len(self._header(i, mode))] + [r[0][i].cell_len for r in rows]) for i in cols]

    def _longest_tail(self) -> int:
        return max([r[1].cell_len for r in self.rows if r is not None] + [cell_len(self.tail or "")])

    def layout(self, width: int | None) -> tuple[str, list[int]]:
        """(mode, indices of the columns shown): mode is 'beside', 'under' or 'stacked'. Sets the gap
        between columns: two spaces, or one where that alone keeps a row on one line (ds4's 51-character
        names and 'unreachable' at 80 columns are one column over with two)."""
        every = list(range(len(self.columns)))
        kept = [i for i in every if not self.columns[i].give_way]
        self._gap = GAP
        if width is None:
            return "beside", every

        def fixed(cols: list[int], mode: str = "beside", gap: str = GAP) -> int:
            return len(INDENT) + sum(self._widths(cols, mode)) + len(gap) * (len(cols) - 1)

        if self.tail is None:
            for cols in (every, kept):
                if fixed(cols) <= width:
                    return "beside", cols
            if fixed(kept, gap=NARROW_GAP) <= width:
                self._gap = NARROW_GAP
                return "beside", kept
            return "stacked", kept
        need = min(TAIL_MIN, self._longest_tail())
        for cols in (every, kept):
            if width - fixed(cols) - len(GAP) >= need:
                return "beside", cols
        for cols in (every, kept):
            if fixed(cols, "under") <= width:
                return "under", cols
        if fixed(kept, "under", NARROW_GAP) <= width:
            self._gap = NARROW_GAP
            return "under", kept
        return "stacked", kept

    def lines(self, width: int | None) -> list[Text]:
        mode, cols = self.layout(width)
        gap = self._gap
        widths = dict(zip(cols, self._widths(cols, mode)))
        key = self.key
        tail_at = len(INDENT) + sum(widths.values()) + len(gap) * len(cols)

        def join(cells: list[tuple[int, Text]], lead: str, pad: bool = True) -> Text:
            out = Text(lead)
            for n, (i, t) in enumerate(cells):
                if n:
                    out.append(gap)
                t = t.copy()
                if pad:
                    t.align("right" if self.columns[i].right else "left", widths[i])
                out.append_text(t)
            return out

        def wrapped(t: Text, lead: str, at: int | None, first: Text | None = None) -> list[Text]:
            """`t` wrapped to what is left of the width after `at` columns; the first piece after
            `first` (the row), the rest under it at `lead`."""
            room = None if width is None or at is None else max(width - at, 1)
            t = t.copy()
            if self.tail_style:
                t.stylize(self.tail_style)
            parts = [t] if room is None else list(t.wrap(_WRAP, room, overflow="fold"))
            out = []
            for n, p in enumerate(parts):
                head = first if (n == 0 and first is not None) else Text(lead)
                out.append(head + p)
            return out

        out: list[Text] = []
        if self.title:
            out.append(Text(self.title, style="bold"))
        headers = {i: Text(self._header(i, mode), style="bold") for i in cols}
        if mode == "stacked":
            rest = [i for i in cols if i != key]
            head = [join([(key, headers[key])], INDENT, pad=False),
                    join([(i, headers[i]) for i in rest], UNDER)]
        else:
            head = [join([(i, headers[i]) for i in cols], INDENT)]
            if self.tail and mode == "beside":
                head[0].append(gap)
                head[0].append(self.tail, style="bold")
        out += [_rstripped(h) for h in head]
        ruled = len(out)
        for row in self.rows:
            if row is None:
                out.append(Text(""))
                continue
            cells, tail = row
            if mode == "beside":
                line = join([(i, cells[i]) for i in cols], INDENT)
                if not tail.plain:
                    out.append(_rstripped(line))
                    continue
                line.append(gap)
                for t in wrapped(tail, " " * tail_at, tail_at, first=line):
                    out.append(t)
                continue
            if mode == "under":
                line = join([(i, cells[i]) for i in cols], INDENT)
                out.append(_rstripped(line))
            else:
                out.append(join([(key, cells[key])], INDENT, pad=False))
                line = join([(i, cells[i]) for i in cols if i != key], UNDER)
                out.append(_rstripped(line))
            if tail.plain:
                out += wrapped(tail, UNDER, len(UNDER))
        out = [_rstripped(t) for t in out]
        if self.rule:  # as long as the longest line below the title, never past the width
            span = max(t.cell_len for t in out[ruled - len(head):])
            out.insert(ruled, Text("─" * min(span, width or span), style="dim"))
        return out

    def text(self, width: int | None) -> str:
        return "\n".join(t.plain for t in self.lines(width))

    def print(self, con: Console, wide: bool = False) -> None:
        for line in self.lines(None if wide or con.width >= WIDE else con.width):
            con.print(line, soft_wrap=True)


# ---- progress -----------------------------------------------------------------------------------

import threading  # noqa: E402 - the progress half of this module only
import time  # noqa: E402

_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, list] = {}  # id(console) -> [rich Progress, number of Steps on it]: one live display per console


class Steps:
    """Progress over `total` steps of one long job (units, objects, builds, repetitions).

    On a terminal: a bar (a row of the console's one live display, so a build's bar sits under
    `porter run`'s); it disappears when done. Elsewhere (a pipe, cron's log): plain lines through
    `plain`, at most one per tenth of the job and one at the end, so a log shows it moving without a
    line per object. Inert when neither is given. Safe to advance from several threads.
    """

    def __init__(self, what: str, total: int, console: Console | None = None, plain=None):
        self.what, self.total, self.done = what, max(0, int(total)), 0
        self._plain = plain
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._tenth = 0
        self._live = None
        self._con = console if console is not None and console.is_terminal else None
        if self.total <= 0:
            return
        if self._con is not None:
            self._live = self._attach()
            self._task = self._live.add_task(what, total=self.total)
        elif self._plain is not None:
            self._plain(f"{what}: 0/{self.total}")

    def _attach(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with _LIVE_LOCK:
            entry = _LIVE.get(id(self._con))
            if entry is None:
                p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=self._con, transient=True)
                p.start()
                entry = _LIVE[id(self._con)] = [p, 0]
            entry[1] += 1
            return entry[0]

    def working_on(self, label: str) -> None:
        if self._live is not None:
            self._live.update(self._task, description=f"{self.what}: {label}")

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            done, tenth = self.done, (self.done * 10) // self.total if self.total else 10
            say = self._plain is not None and self._live is None and tenth > self._tenth and done < self.total
            if say:
                self._tenth = tenth
        if self._live is not None:
            self._live.advance(self._task, n)
        elif say:
            self._plain(f"{self.what}: {done}/{self.total} ({time.monotonic() - self._t0:.0f} s)")

    def stop(self) -> None:
        with self._lock:
            live, self._live = self._live, None
            plain_end = self._plain is not None and self._con is None and self.total > 0 and self._tenth >= 0
            self._tenth = -1  # once
        if live is not None:
            with _LIVE_LOCK:
                entry = _LIVE.get(id(self._con))
                entry[1] -= 1
                if entry[1] <= 0:  # the last one draws its final frame as the display ends
                    entry[0].stop()
                    del _LIVE[id(self._con)]
                else:
                    live.remove_task(self._task)
        elif plain_end:
            self._plain(f"{self.what}: {self.done}/{self.total} in {time.monotonic() - self._t0:.0f} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def command_steps(what: str, total: int) -> Steps:
    """Steps for a command whose stdout is its result (the benchmarks): a bar on stderr's terminal, else
    plain lines on stderr, so what the command prints stays what it measured."""
    import sys

    return Steps(what, total, console=console(file=sys.stderr), plain=lambda line: print(line, file=sys.stderr))


def steps_factory(console: Console | None = None, plain=None):
    """What a command hands to code that runs long jobs: `factory(what, total) -> Steps`."""
    return lambda what, total: Steps(what, total, console=console, plain=plain)
