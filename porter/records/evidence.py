"""Evidence: the facts a gate's verdict rests on, stored content-addressed.

ledger/evidence/<sha256>.json holds the canonical JSON (sorted keys, no
whitespace, UTF-8) of one evidence dict, and <sha256> is the sha256 of exactly
those bytes. Ledger records and commit trailers name evidence by that hash, so
an edited file, or one swapped for another unit's, no longer hashes to its own
name and is refused.

Every evidence dict has: target, unit, gate, ok, candidate_sha256 (the sha256
of the unit source the gate judged), toolchain {...} (porter.host.toolchain), plus the
gate's own facts (seeds, shapes, metrics, timing, library path, ...): gate_facts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from porter.records.durable import write_atomic
from porter.errors import PorterError
from porter.digest import sha256_bytes
from porter.records.durable import read_regular
from porter.records.ledger import LEDGER_DIR, canonical

EVIDENCE_DIR = "evidence"
REQUIRED = ("target", "unit", "gate", "ok", "candidate_sha256")
_SHA = re.compile(r"[0-9a-f]{64}")
# The largest evidence measured is a few hundred KB (a parity gate's per-case metrics); a path that is
# a device, a symlink or bigger than this is refused unread (tampered), never read into memory.
MAX_BYTES = 16 << 20


def is_sha256(value) -> bool:
    return isinstance(value, str) and _SHA.fullmatch(value) is not None


def gate_facts(target, unit: str, gate: str, candidate_sha256: str | None, toolchain: dict, **facts) -> dict:
    """An evidence dict's common fields (REQUIRED but `ok`, which a gate adds with its verdict, and the
    toolchain), then the gate's own `facts`: every gate's evidence starts here."""
    return {"target": target.name, "unit": unit, "gate": gate, "candidate_sha256": candidate_sha256,
            "toolchain": toolchain, **facts}


def evidence_dir(workspace: Path) -> Path:
    return Path(workspace) / LEDGER_DIR / EVIDENCE_DIR


def evidence_path(workspace: Path, sha: str) -> Path:
    if not is_sha256(sha):
        raise PorterError(f"not an evidence id (64 lowercase hex digits): {str(sha)[:80]!r}")
    return evidence_dir(workspace) / f"{sha}.json"


def store_evidence(workspace: Path, data: dict) -> str:
    """Write `data` as ledger/evidence/<sha256>.json and return the sha256."""
    if not isinstance(data, dict):
        raise TypeError("evidence must be a dict")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"evidence lacks {', '.join(missing)} (every evidence names {', '.join(REQUIRED)})")
    body = canonical(data)
    sha = sha256_bytes(body)
    path = evidence_path(workspace, sha)
    if path.is_file() and path.read_bytes() == body:
        return sha
    write_atomic(path, body)
    return sha


def _read_checked(workspace: Path, sha: str) -> tuple[bytes | None, str | None]:
    if not is_sha256(sha):
        return None, f"evidence id {str(sha)[:80]!r} is not a sha256"
    try:
        body = read_regular(f"{workspace}/{LEDGER_DIR}/{EVIDENCE_DIR}/{sha}.json", MAX_BYTES)  # str: ~4k a call
    except FileNotFoundError:
        return None, f"evidence {sha[:12]} is missing (ledger/evidence/{sha}.json)"
    except OSError as exc:
        return None, f"evidence {sha[:12]} is refused: {exc.strerror}"
    actual = sha256_bytes(body)
    if actual != sha:
        return None, f"evidence {sha[:12]} was edited or swapped (its content hashes to {actual[:12]})"
    return body, None


def evidence_problem(workspace: Path, sha: str) -> str | None:
    """None when ledger/evidence/<sha>.json is intact (a regular file hashing to its name), else the
    one-line problem. Not parsed: a signed record names it by hash, so intact is all there is to check."""
    return _read_checked(workspace, sha)[1]


def check_evidence(workspace: Path, sha: str) -> tuple[dict | None, str | None]:
    """(evidence, None) when ledger/evidence/<sha>.json is intact, else (None, one-line problem)."""
    body, problem = _read_checked(workspace, sha)
    if problem is not None:
        return None, problem
    try:
        data = json.loads(body)
    except ValueError:
        return None, f"evidence {sha[:12]} is not JSON"
    if not isinstance(data, dict):
        return None, f"evidence {sha[:12]} is not a JSON object"
    return data, None


def load_evidence(workspace: Path, sha: str) -> dict:
    """The evidence named `sha`; PorterError (exit 3) when it is missing, edited or swapped."""
    data, problem = check_evidence(workspace, sha)
    if problem is not None:
        raise PorterError(problem, exit_code=3)
    return data
