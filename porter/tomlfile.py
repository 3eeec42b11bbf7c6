"""The one reader of the TOML files a target and its tools declare: a file that does not parse (bad syntax,
bytes that are not UTF-8) or that is missing where it is required is one line naming the file, in the
error type the caller's layer raises, never a traceback from tomllib."""

from __future__ import annotations

import tomllib
from pathlib import Path

from porter.errors import PorterError

REQUIRED = object()  # `missing=REQUIRED`: a missing file is an error, not an empty table


def read_toml(path: Path | str, *, missing=REQUIRED, error: type[Exception] = PorterError,
              why_needed: str = "") -> dict:
    """The file's top-level table.  `missing`: what a missing file reads as (REQUIRED: an error, whose
    message ends with `why_needed` where given)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        if missing is not REQUIRED:
            return missing
        raise error(f"{path} does not exist" + (f": {why_needed}" if why_needed else "")) from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_toml(text, path, error)


def parse_toml(text: str, where: Path | str, error: type[Exception] = PorterError) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML: {exc}") from None
