"""The identity of the backend sources an e2e run judged: one hash over their git blobs.

The backend is the workspace's CUDA unit files (targets/<name>/ported/) and the
target's CUDA glue (targets/<name>/cuda/).  The hash is sha256 over the sorted
lines "<path> <git blob id>" of every file under those folders.  Computed from
a commit (git ls-tree) or from the work tree (git hash-object of each file,
tracked or not yet added), it is the same value exactly when the files are the
same, so a record made on uncommitted code matches HEAD only once that very
code is committed.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from porter.errors import PorterError


def backend_dirs(target) -> list[str]:
    ws = Path(target.workspace).resolve()
    out = []
    for d in (target.ported_dir, target.cuda_dir):
        try:
            out.append(Path(d).resolve().relative_to(ws).as_posix())
        except ValueError:
            raise PorterError(f"backend folder {d} is outside the workspace {ws}") from None
    return out


def _git(workspace: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, input=input)
    if proc.returncode != 0:
        raise PorterError(f"git {' '.join(args[:2])} failed in {workspace}: "
                          f"{proc.stderr.decode(errors='replace').strip().splitlines()[-1:] or ['?']}")
    return proc.stdout.decode()


def _digest(entries: list[tuple[str, str]]) -> str:
    body = "".join(f"{path} {blob}\n" for path, blob in sorted(entries))
    return hashlib.sha256(body.encode()).hexdigest()


def tree_hash_at(workspace: Path, dirs: list[str], commit: str = "HEAD") -> str | None:
    """The backend hash at `commit`; None when the workspace has no such commit (no HEAD yet)."""
    probe = subprocess.run(["git", "-C", str(workspace), "rev-parse", "--verify", "-q", f"{commit}^{{commit}}"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    out = _git(workspace, "ls-tree", "-r", "-z", commit, "--", *dirs)
    entries = []
    for item in filter(None, out.split("\0")):
        meta, _, path = item.partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob":
            entries.append((path, blob))
    return _digest(entries)


def tree_hash_worktree(workspace: Path, dirs: list[str]) -> str:
    """The backend hash of the files on disk now (tracked, and untracked ones git does not ignore)."""
    listed = _git(workspace, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *dirs)
    paths = sorted({p for p in listed.split("\0") if p and (Path(workspace) / p).is_file()})
    if not paths:
        return _digest([])
    blobs = _git(workspace, "hash-object", "--stdin-paths", input="\n".join(paths).encode() + b"\n").split()
    return _digest(list(zip(paths, blobs)))


def head_commit(workspace: Path) -> str | None:
    probe = subprocess.run(["git", "-C", str(workspace), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True)
    return probe.stdout.decode().strip() or None if probe.returncode == 0 else None
