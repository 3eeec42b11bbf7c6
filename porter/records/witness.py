"""The witness: the latest signed ledger head, kept outside the workspace.

Like a Certificate Transparency signed tree head, it lets a later reader tell
that history moved backwards: a `git reset --hard`, a ledger truncated back to
an earlier valid prefix, or records removed and the chain re-signed by someone
holding the key. Every signed append updates it (under the ledger's flock):

  {"genesis": hash of record 1, "workspace": path, "fingerprint": key,
   "seq": n, "hash": hash of record n, "time": ..., "steps": {"<target>/<unit>": {"seq", "hash", "state"}}}

Files: $PORTER_WITNESS_DIR (default $PORTER_HOME/witness)/<genesis[:32]>.json,
named by the ledger's first record so that teammates sharing the directory
share one witness per ledger, and by-path/<sha256(workspace path)[:32]>
holding the genesis a path's ledger had, so a ledger replaced wholesale (new
genesis) is caught on the machine that wrote it.  `porter init` drops the
by-path entry of the path it makes a workspace at (new_workspace): a new
workspace where a deleted one was is not a rollback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from porter.digest import sha256_bytes
from porter.records.durable import write_atomic
from porter.records.durable import read_regular
from porter.records.signing import porter_home

DIR_ENV = "PORTER_WITNESS_DIR"
MAX_BYTES = 64 << 20  # a witness holds one entry per unit: far below this


def witness_dir() -> Path:
    named = os.environ.get(DIR_ENV)
    return Path(named).expanduser() if named else porter_home() / "witness"


def _path_key(workspace: Path) -> str:
    return sha256_bytes(str(Path(workspace).resolve()).encode())[:32]


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _health(path: Path) -> str:
    """"ok", "missing", "empty" or "corrupt": what the witness file at `path` is."""
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "corrupt"
    if not raw.strip():
        return "empty"
    try:
        data = json.loads(raw)
    except ValueError:
        return "corrupt"
    ok = isinstance(data, dict) and isinstance(data.get("seq"), int) and isinstance(data.get("hash"), str)
    return "ok" if ok else "corrupt"


def load(workspace: Path, genesis: str | None, expected: bool = False) -> tuple[dict | None, str | None, dict]:
    """(witness of this ledger, genesis the path's by-path entry names, health). `expected`: this
    machine should hold a witness (it holds the ledger's signing key). health is {"state", "path"}:
    "ok"; "none" (this machine never witnessed the ledger: a rollback cannot be seen here);
    "missing", "empty" or "corrupt" (it did, or should have: deleted or damaged)."""
    d = witness_dir()
    by_path = None
    try:
        by_path = (d / "by-path" / _path_key(workspace)).read_text().strip() or None
    except OSError:
        pass
    path = d / f"{genesis[:32]}.json" if isinstance(genesis, str) else None
    w = _read(path) if path is not None else None
    state = _health(path) if path is not None else "none"
    if w is None and by_path:
        w = _read(d / f"{by_path[:32]}.json")
        state = "ok" if w is not None else state
    if state == "ok" and w is None:
        state = "corrupt"
    if state == "missing" and not (by_path or expected):
        state = "none"
    return w, by_path, {"state": state, "path": str(path) if path is not None else None}


def health_problem(health: dict) -> str | None:
    """The one-line problem of a deleted or damaged witness; None when it is fine or never existed."""
    state = health["state"]
    if state not in ("missing", "empty", "corrupt"):
        return None  # "ok", "none", "unsigned" (no witness is kept for an unsigned ledger)
    return (f"witness {state.upper()}: {health['path']} ({'deleted' if state == 'missing' else 'damaged'}: a rollback "
            "since it was last written cannot be ruled out; `porter repair --reason TEXT` re-witnesses the ledger)")


def new_workspace(workspace: Path) -> None:
    """`porter init` made a new workspace at this path: the ledger a workspace there had before (deleted,
    `rm -rf` and the README's block again) is not this one's, so the path's by-path entry is dropped and
    the new ledger's first record starts it again.  A ledger replaced under a workspace without `porter
    init` keeps the entry and is still a rollback.  The witness of the old ledger (named by its first
    record) is kept: that ledger, copied back, is checked against it."""
    try:
        (witness_dir() / "by-path" / _path_key(workspace)).unlink()
    except FileNotFoundError:
        pass


class Writer:
    """Keeps one ledger's witness current; the Ledger calls `saw` after each signed append."""

    def __init__(self, workspace: Path, fingerprint: str):
        self.workspace = Path(workspace).resolve()
        self.fingerprint = fingerprint
        self.state: dict | None = None

    def saw(self, record: dict, first_hash: str) -> None:
        if self.state is None or self.state.get("genesis") != first_hash:
            self.state = _read(witness_dir() / f"{first_hash[:32]}.json") or {"genesis": first_hash, "steps": {}}
            by_path = witness_dir() / "by-path" / _path_key(self.workspace)
            try:
                known = by_path.read_text().strip()
            except OSError:
                known = None
            if known != first_hash:
                write_atomic(by_path, first_hash.encode())
        st = self.state
        st.update(workspace=str(self.workspace), fingerprint=self.fingerprint, seq=record["seq"],
                  hash=record["hash"], time=record.get("time"))
        if record.get("kind") == "step" and isinstance(record.get("unit"), str):
            st.setdefault("steps", {})[f"{record.get('target')}/{record['unit']}"] = {
                "seq": record["seq"], "hash": record["hash"], "state": record.get("state")}
        write_atomic(witness_dir() / f"{first_hash[:32]}.json", json.dumps(st, sort_keys=True).encode())

    def reset(self, entries: list[tuple[int, dict]]) -> None:
        """Rebuild from the ledger as it is (after `porter repair` accepted a loss)."""
        if not entries:
            return
        first = entries[0][1]["hash"]
        self.state = {"genesis": first, "steps": {}}
        write_atomic(witness_dir() / f"{first[:32]}.json", b"{}")
        for _, rec in entries:
            if rec.get("kind") == "step" and isinstance(rec.get("unit"), str):
                self.state["steps"][f"{rec.get('target')}/{rec['unit']}"] = {
                    "seq": rec["seq"], "hash": rec["hash"], "state": rec.get("state")}
        self.saw(entries[-1][1], first)


def check(w: dict | None, by_path: str | None, entries: list[tuple[int, dict]], fingerprint: str | None,
          target: str) -> tuple[list[str], dict[str, str]]:
    """(problems not tied to a unit, unit -> problem): what moved backwards since the witness."""
    problems: list[str] = []
    per_unit: dict[str, str] = {}
    genesis = entries[0][1].get("hash") if entries else None
    if by_path and genesis != by_path and (w is None or w.get("genesis") != genesis):
        problems.append(f"rolled back: this workspace's ledger began with record {by_path[:12]} when the witness last "
                        f"saw it; it now begins with {str(genesis)[:12]} (ledger replaced or emptied)")
    if w is None:
        return problems, per_unit
    if w.get("fingerprint") and w.get("fingerprint") != fingerprint:
        problems.append(f"signing key changed since the witness: it saw {w['fingerprint']}, the workspace now names "
                        f"{fingerprint or 'no key'} (key swapped or removed)")
    by_seq: dict[int, dict] = {}
    for _, rec in entries:
        if isinstance(rec.get("seq"), int):
            by_seq.setdefault(rec["seq"], rec)
    last = max(by_seq, default=0)
    wseq, whash = w.get("seq"), w.get("hash")
    if isinstance(wseq, int):
        head = by_seq.get(wseq)
        if head is None:
            problems.append(f"rolled back: the ledger ends at seq {last}, the witness saw seq {wseq} "
                            f"({w.get('time')}): records {last + 1}-{wseq} are gone")
        elif head.get("hash") != whash:
            problems.append(f"rolled back: record seq {wseq} is not the one the witness saw "
                            f"({str(whash)[:12]}): history before it was rewritten or records removed")
    for key, s in sorted((w.get("steps") or {}).items()):
        t, _, unit = key.partition("/")
        if t != target or not isinstance(s, dict):
            continue
        rec = by_seq.get(s.get("seq"))
        if rec is None or rec.get("hash") != s.get("hash"):
            per_unit[unit] = (f"rolled back: its {s.get('state')} step (ledger seq {s.get('seq')}, "
                              f"{str(s.get('hash'))[:12]}) seen by the witness is gone")
    return problems, per_unit
