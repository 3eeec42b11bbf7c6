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
from pathlib import Path

from porter.records import gitops
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


def _digest(entries: list[tuple[str, str]]) -> str:
    body = "".join(f"{path} {blob}\n" for path, blob in sorted(entries))
    return hashlib.sha256(body.encode()).hexdigest()


def tree_hash_at(workspace: Path, dirs: list[str], commit: str = "HEAD") -> str | None:
    """The backend hash at `commit`; None when the workspace has no such commit (no HEAD yet)."""
    if gitops.commit_of(workspace, commit) is None:
        return None
    out = gitops.read(workspace, "ls-tree", "-r", "-z", commit, "--", *dirs).decode()
    entries = []
    for item in filter(None, out.split("\0")):
        meta, _, path = item.partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob":
            entries.append((path, blob))
    return _digest(entries)


def tree_hash_worktree(workspace: Path, dirs: list[str], replacing: dict[str, bytes] | None = None) -> str:
    """The backend hash of the files on disk now (tracked, and untracked ones git does not ignore).
    `replacing`: {workspace-relative path: bytes} that stand in for those files (a candidate unit the
    e2e gate judges before it is written: the hash is the one the tree will have once it lands)."""
    replacing = dict(replacing or {})
    listed = gitops.read(workspace, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *dirs).decode()
    paths = sorted({p for p in listed.split("\0")
                    if p and p not in replacing and (Path(workspace) / p).is_file()})
    blobs = gitops.read(workspace, "hash-object", "--stdin-paths",
                        input="\n".join(paths).encode() + b"\n").decode().split() if paths else []
    entries = list(zip(paths, blobs))
    entries += [(p, gitops.read(workspace, "hash-object", "--stdin", input=data).decode().strip())
                for p, data in replacing.items()]
    return _digest(entries)


head_commit = gitops.head  # the e2e drivers' name for it
