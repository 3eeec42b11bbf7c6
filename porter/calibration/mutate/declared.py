"""A target's reviewed equivalent survivors: targets/<t>/equivalent_mutants.toml.

    [[equivalent]]
    unit = "mini_gpu_swiglu_tensor"
    op = "constant"
    id = "3f2a9c1b0d4e"          # the mutant's id, as the mutation report prints it
    reason = "the grid clamp 65535*8 -> 65536*8 is never reached: n is below 2^27 for every caller"

A survivor someone has read and shown to behave exactly as the known-good on every input the API
allows counts as equivalent, with its reason; it is never a kill.  A declaration whose mutant no run
produced any more (its code changed) is listed as stale.  Anything malformed is a one-line error
naming the file and the entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from porter.calibration.mutate.generate import ID_LENGTH
from porter.calibration.mutate.operators import BY_NAME
from porter.errors import PorterError
from porter.tomlfile import parse_toml

FILE = "equivalent_mutants.toml"
KEYS = ("unit", "op", "id", "reason")
_ID = re.compile(rf"^[0-9a-f]{{{ID_LENGTH}}}$")


@dataclass(frozen=True)
class Declared:
    unit: str
    op: str
    id: str
    reason: str


def parse(text: str, where: str = FILE) -> dict[str, Declared]:
    """id -> declaration, from the file's text; PorterError (one line) on anything malformed."""
    data = parse_toml(text, where)
    extra = sorted(set(data) - {"equivalent"})
    if extra:
        raise PorterError(f"{where}: unknown table(s) {', '.join(extra)}; entries are [[equivalent]]")
    entries = data.get("equivalent", [])
    if not isinstance(entries, list):
        raise PorterError(f"{where}: `equivalent` must be an array of tables ([[equivalent]])")
    out: dict[str, Declared] = {}
    for i, e in enumerate(entries, 1):
        at = f"{where}: equivalent #{i}"
        if not isinstance(e, dict):
            raise PorterError(f"{at}: not a table")
        missing = [k for k in KEYS if k not in e]
        if missing:
            raise PorterError(f"{at} lacks {', '.join(missing)} (each needs {', '.join(KEYS)})")
        unknown = sorted(set(e) - set(KEYS))
        if unknown:
            raise PorterError(f"{at}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
        bad = [k for k in KEYS if not isinstance(e[k], str) or not e[k].strip()]
        if bad:
            raise PorterError(f"{at}: {', '.join(bad)} must be non-empty strings")
        if e["op"] not in BY_NAME:
            raise PorterError(f"{at}: no operator {e['op']!r} (known: {', '.join(BY_NAME)})")
        if not _ID.match(e["id"]):
            raise PorterError(f"{at}: id {e['id']!r} is not a mutant id ({ID_LENGTH} lower-case hex digits)")
        if e["id"] in out:
            raise PorterError(f"{at}: mutant {e['id']} is declared twice")
        out[e["id"]] = Declared(e["unit"], e["op"], e["id"], e["reason"].strip())
    return out


def load(target_dir: Path) -> dict[str, Declared]:
    """The target's declarations ({} when it has no file)."""
    path = Path(target_dir) / FILE
    if not path.is_file():
        return {}
    return parse(path.read_text(), str(path))
