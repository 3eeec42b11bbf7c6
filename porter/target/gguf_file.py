"""A user's GGUF model file, checked before anything reads it, with one line that says what is wrong.

gguf-py's reader maps the file and parses it with numpy: a directory, a download cut short or another
format otherwise surfaces as "does not exist", numpy's "When changing to a larger dtype ..." or an
IndexError. Every command that takes --model GGUF goes through here first.
"""

from __future__ import annotations

from pathlib import Path

from porter.errors import PorterError

MAGIC = b"GGUF"


def model_file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be a GGUF model file, or None when it may be one (its magic is right)."""
    p = Path(path)
    if p.is_dir():
        return f"model file {p} is a directory, not a GGUF file: name the .gguf file inside it"
    if not p.exists():
        return f"model file {p} does not exist"
    if not p.is_file():
        return f"model file {p} is not a regular file"
    try:
        with p.open("rb") as f:
            head = f.read(len(MAGIC))
    except OSError as exc:
        return f"model file {p} cannot be read: {exc.strerror}"
    if head != MAGIC:
        what = "it is empty" if not head else f"it starts with {head!r}"
        return f"{p} is not a GGUF file ({what}; a GGUF file starts with {MAGIC!r})"
    return None


def check_model_file(path: str | Path) -> Path:
    problem = model_file_problem(path)
    if problem:
        raise PorterError(problem)
    return Path(path)


def unreadable(path: str | Path, exc: BaseException) -> str:
    """The line for a GGUF whose magic is right but that gguf-py could not read (it maps every tensor's
    data, so a file cut anywhere, header or data, ends here)."""
    p = Path(path)
    size = p.stat().st_size if p.is_file() else 0
    return (f"{p} is a truncated or damaged GGUF file ({size:,} bytes that gguf-py cannot read: "
            f"{type(exc).__name__}); a download cut short? fetch it again")
