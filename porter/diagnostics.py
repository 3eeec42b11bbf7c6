"""Tool output made fit for a prompt, the ledger and evidence: one trim for the build gate and the prompt.

The rule it enforces: what a compiler read flows out only where it is the
candidate's own text.  A candidate that includes another file (the signing
key, a file of the user's) makes nvcc echo that file's lines and quote its
identifiers (`/x/signing_key(1): error: identifier "b3Blbn..." is undefined`,
then the line itself); gas does the same for `.include`.  So a message whose
location is not one of the unit's own files keeps its file, line and kind and
loses its text and everything the compiler printed under it; of an
"In file included from" chain only the unit's own line stays, on that message.  The
unit's own files are the candidate and the target headers the prompt already
shows; at the build gate they are matched as the compiler names them (the
candidate is compiled from its folder by bare file name, so `/x/unit.cu` is
another file), in a prompt by file name (paths are already stripped there).
The compiler's sandbox (porter/gates/compile_jail.py) is the wall; this is
the second line.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

MAX_ERRORS = 12  # error messages kept
MAX_DIAG_CHARS = 6000
MAX_LINE_CHARS = 400

_EDG_AT = re.compile(r"^(?P<file>[^\s(][^()\n]*?)\((?P<line>\d+)\): (?P<what>.*)$")
_GCC_AT = re.compile(r"^(?P<file>[^\s:][^:\n]*?):(?P<line>\d+)(?::\d+)?: (?P<what>.*)$")
_FILE_HEAD = re.compile(r"^(?P<file>[^\s:][^:\n]*?): (?:Assembler messages:|In (?:member |static member )?function\b"
                        r"|In instantiation\b|In constructor\b|In destructor\b|At global scope:|At top level:)")
_INCLUDED = re.compile(r"^(?:In file included from|\s+from) (?P<file>[^\n]+?):(?P<line>\d+)[:,]?$")
_AT_LINE = re.compile(r"at line (?P<line>\d+) of (?P<file>\S+)")
_KIND = re.compile(r"^(catastrophic error|fatal error|error|warning|note|remark|Error|Warning)\b", re.I)
_ABS_PATH = re.compile(r"(?<![\w.])/(?:[^\s:'\"()<>]+/)+([^\s/:'\"()<>]+)")
_ERROR = re.compile(r"\berror\b|undefined reference|multiple definition|ptxas fatal|nvlink error", re.I)
_WARNING = re.compile(r"\bwarning\b", re.I)


def confine(text: str, own: Callable[[str], bool]) -> str:
    """Messages located outside the unit's own files reduced to where and what kind (see the module doc)."""
    out: list[str] = []
    foreign = False
    included = ""  # the unit's line an "In file included from" chain starts at, for the message it heads
    for line in text.splitlines():
        inc = _INCLUDED.match(line)
        if inc:
            if own(inc.group("file")):
                included = f", included from {inc.group('file')}:{inc.group('line')}"
            continue
        at = _EDG_AT.match(line) or _GCC_AT.match(line)
        if at:
            foreign = not own(at.group("file"))
            if not foreign:
                out.append(line)
            else:
                kind = _KIND.match(at.group("what"))
                out.append(f"{at.group('file')}({at.group('line')}): {kind.group(1).lower() if kind else 'message'} "
                           f"in a file outside the unit{included} (its text is not shown: only the unit's own lines are)")
            included = ""
            continue
        head = _FILE_HEAD.match(line)
        if head:
            foreign = not own(head.group("file"))
            if not foreign:
                out.append(line)
            continue
        if line[:1].isspace() or not line:
            if foreign:  # what the compiler printed under a foreign message: only where it points into the unit
                out += [f"    (from line {m.group('line')} of {m.group('file')})"
                        for m in _AT_LINE.finditer(line) if own(m.group("file"))]
            else:
                out.append(line)
            continue
        foreign = False  # a tool's own line at column 0 ("2 errors detected ...", ld, ptxas)
        out.append(line)
    return "\n".join(out)


def own_by_name(names: Iterable[str]) -> Callable[[str], bool]:
    """The unit's own files matched by file name: in a prompt, whose paths the build gate stripped."""
    keep = {n.rsplit("/", 1)[-1] for n in names if n}
    return lambda f: f.strip().rsplit("/", 1)[-1] in keep


def _messages(lines: list[str]) -> list[list[str]]:
    """Lines grouped into messages: an error or warning line and up to three lines under it."""
    out: list[list[str]] = []
    for line in lines:
        if _ERROR.search(line) or _WARNING.search(line) or not out:
            out.append([line])
        elif len(out[-1]) < 4:
            out[-1].append(line)
    return out


def trim_diagnostics(text: str, limit: int = MAX_DIAG_CHARS, *, compiler: bool = False,
                     own: Callable[[str], bool] | None = None, strip: Iterable = (),
                     max_errors: int | None = MAX_ERRORS) -> str:
    """What a model can act on, within `limit` characters.  `own`: the unit's own files, and the
    text is confined to them first (module doc).  `strip`: folders taken off paths (other absolute
    paths are cut to their file name).  `compiler`: the text is a compiler's output, so its error
    messages (each with the source line and caret under it) come first, at most `max_errors` (None: all),
    repeats dropped, then its warnings' first lines."""
    text = text or ""
    if own is not None:
        text = confine(text, own)
    for s in sorted({str(x).rstrip("/") for x in strip if x}, key=len, reverse=True):
        text = text.replace(s + "/", "")
    text = re.sub(r"/tmp/tmpxft_[0-9a-f_]+-\d+_", "", text)
    lines = _ABS_PATH.sub(lambda m: m.group(1), text).strip().splitlines()
    if compiler or own is not None:
        messages = _messages(lines)
        errors = [m for m in messages if _ERROR.search(m[0])]
        warnings = [m[0] for m in messages if not _ERROR.search(m[0]) and _WARNING.search(m[0])]
        if errors or warnings:
            seen: set[str] = set()
            picked, skipped = [], 0
            for m in errors:
                if m[0].strip() in seen:
                    continue
                seen.add(m[0].strip())
                if max_errors is not None and len(seen) > max_errors:
                    skipped += 1
                    continue
                picked += [ln.rstrip() for ln in m if ln.strip() or ln is m[0]]
            for w in warnings:
                if w.strip() not in seen:
                    seen.add(w.strip())
                    picked.append(w)
            if skipped:
                picked.append(f"... {skipped} more error(s) not shown")
            lines = picked
    out, size = [], 0
    for line in lines:
        line = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS - 3] + "..."
        if size + len(line) + 1 > limit - 40:  # room for the note below
            out.append(f"... ({len(lines) - len(out)} more lines not shown)")
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out).strip()
