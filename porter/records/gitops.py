"""The git side of a workspace: one commit per verified (or built) step.

porter drives the `git` command line so that what it does is exactly what a
person could retype (gitpython's `repo.git.*` runs the same git processes, and
importing it cost ~0.1 s on every `porter status`); no other module reaches git
(tests/test_architecture.py).  `read` only looks; `git` may commit (it passes an
identity).  A step commit holds the unit file, the ledger and the evidence
files together, and carries trailers that tie it to the ledger record it commits:

    porter: built mini_gpu_add_tensor (attempt 2)

    Porter-Unit: mini_gpu_add_tensor
    Porter-Target: minimoe
    Porter-State: built
    Porter-Candidate: <sha256 of the unit file>
    Porter-Step: <hash of the "step" ledger record>
    Porter-Evidence: <sha256>            (one line per evidence file)
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from porter.records.durable import write_atomic
from porter.errors import PorterError

# Used only when the user has no git identity configured (fresh CI boxes).
FALLBACK_NAME = "porter"
FALLBACK_EMAIL = "porter@localhost"


def _run(workspace: Path | None, args: list[str], input=None, text: bool = False) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=workspace, capture_output=True, input=input, text=text)
    except FileNotFoundError as exc:
        missing = workspace is not None and not Path(workspace).is_dir()
        raise PorterError(f"{workspace}: no such directory" if missing else "git not found on PATH") from exc


def _failure(args, r: subprocess.CompletedProcess) -> PorterError:
    out = [o if isinstance(o, str) else o.decode(errors="replace") for o in (r.stderr, r.stdout)]
    msg = (out[0].strip() or out[1].strip()).splitlines()
    return PorterError(f"git {args[0]} failed: {msg[-1] if msg else 'exit ' + str(r.returncode)}")


def read(workspace: Path, *args: str, input: bytes | None = None) -> bytes:
    """stdout of a git command that must succeed (bytes in and out); a failure is a one-line PorterError."""
    r = _run(workspace, list(args), input)
    if r.returncode != 0:
        raise _failure(args, r)
    return r.stdout


@lru_cache(maxsize=None)
def _identity_args(cwd: str) -> tuple[str, ...]:
    args: list[str] = []
    for key, fallback in (("user.name", FALLBACK_NAME), ("user.email", FALLBACK_EMAIL)):
        r = _run(Path(cwd), ["config", "--get", key])
        if r.returncode != 0 or not r.stdout.strip():
            args += ["-c", f"{key}={fallback}"]
    return tuple(args)


def git(workspace: Path, *args: str, check: bool = True, input: str | None = None) -> str:
    """Run git in `workspace` with an identity (a commit needs one); return stdout.  A failure is a one-line
    PorterError."""
    r = _run(workspace, [*_identity_args(str(workspace)), *args], input, text=True)
    if check and r.returncode != 0:
        raise _failure(args, r)
    return r.stdout


def toplevel(path: Path) -> Path | None:
    """The work tree holding `path`; None when `path` is missing or in no git repository."""
    r = _run(path, ["rev-parse", "--show-toplevel"]) if Path(path).is_dir() else None
    return Path(r.stdout.decode().strip()) if r is not None and r.returncode == 0 else None


def init_repo(path: Path) -> None:
    r = _run(None, ["init", "-q", "-b", "main", str(path)])
    if r.returncode != 0:  # git < 2.28 has no -b
        git(path, "init", "-q")


def commit_of(workspace: Path, rev: str = "HEAD") -> str | None:
    """The commit `rev` names, or None when there is none (no HEAD yet, an unknown sha)."""
    r = _run(workspace, ["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"])
    return r.stdout.decode().strip() or None if r.returncode == 0 else None


head = commit_of  # of HEAD, its default


def check_index_unlocked(workspace: Path) -> None:
    lock = Path(git(workspace, "rev-parse", "--git-dir").strip())
    lock = (lock if lock.is_absolute() else workspace / lock) / "index.lock"
    if lock.exists():
        raise PorterError(
            f"git index is locked ({lock}): another git command is running, or one was killed; "
            "remove the file if no git command is running"
        )


def committed_blob(workspace: Path, rel: str, rev: str = "HEAD") -> bytes | None:
    """The content of `rel` at `rev` (HEAD), or None when it has no such file."""
    r = _run(workspace, ["show", f"{rev}:{rel}"])
    return r.stdout if r.returncode == 0 else None


def restore(workspace: Path, rel: str) -> None:
    """Put `rel` back to its HEAD version (remove it when HEAD does not have it)."""
    blob = committed_blob(workspace, rel)
    path = workspace / rel
    if blob is None:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, blob)


def step_message(target: str, unit: str, state: str, attempt: int, candidate_sha256: str,
                 step_hash: str, evidence: list[str], headline: str = "") -> str:
    """headline: what the step did beyond passing its gates (a speedup and its p), after the subject."""
    lines = [
        f"porter: {state} {unit} (attempt {attempt})" + (f": {headline}" if headline else ""),
        "",
        f"Porter-Unit: {unit}",
        f"Porter-Target: {target}",
        f"Porter-State: {state}",
        f"Porter-Candidate: {candidate_sha256}",
        f"Porter-Step: {step_hash}",
    ]
    lines += [f"Porter-Evidence: {sha}" for sha in evidence]
    return "\n".join(lines) + "\n"


TEMP_FILE_GLOB = ".*.tmp-*"  # porter.records.durable.write_atomic's temp-file names


def commit_paths(workspace: Path, paths: list[str], message: str) -> str:
    """Commit exactly `paths` (files or folders, relative to the workspace) with `message`; return the sha.

    Other changes in the index or the work tree are left out of the commit.
    Hooks are not run: a step commit must hold what the ledger says it holds.
    """
    existing = [p for p in paths if (workspace / p).exists() or committed_blob(workspace, p) is not None]
    # durable.write_atomic's temp files (another thread of --jobs N writing evidence) are never part of
    # a commit, and one renamed away mid-add made `git add` fail (measured on ds4 with --jobs 8)
    git(workspace, "add", "-A", "--", *existing, f":(exclude,glob)**/{TEMP_FILE_GLOB}")
    git(workspace, *signing_args(workspace), "commit", "-q", "--no-verify", "-F", "-", "--", *existing, input=message)
    return head(workspace) or ""


def signing_args(workspace: Path) -> tuple[str, ...]:
    """In a signed workspace, sign the commit with the ledger's key through git's own SSH signing
    (gpg.format=ssh: ssh-keygen -Y sign), so `git verify-commit` checks it against ledger/signer.pub
    (see docs/security.md: allowed-signers line). Nothing when the workspace is unsigned or ssh-keygen is absent."""
    from porter.records import signing

    if not signing.workspace_key_path(workspace).is_file() or shutil.which("ssh-keygen") is None:
        return ()
    key = signing.private_key_path()
    if not key.is_file():
        return ()
    return ("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "-c", "commit.gpgsign=true")


def allowed_signers_line(workspace: Path) -> str:
    """The line of an allowed-signers file (gpg.ssh.allowedSignersFile) that trusts the workspace key."""
    from porter.records import signing

    return "porter@ledger " + " ".join(signing.workspace_key_path(workspace).read_text().split()[:2])


def commits_with_trailer(workspace: Path, key: str, value: str) -> list[str]:
    """Commits reachable from HEAD whose message has the line `key: value`."""
    if head(workspace) is None:
        return []
    out = git(workspace, "log", "--format=%H", "-F", f"--grep={key}: {value}")
    shas = []
    for sha in out.split():
        body = git(workspace, "log", "-1", "--format=%B", sha)
        if any(line.strip() == f"{key}: {value}" for line in body.splitlines()):
            shas.append(sha)
    return shas


def trailers(workspace: Path, sha: str) -> dict[str, list[str]]:
    body = git(workspace, "log", "-1", "--format=%B", sha)
    out: dict[str, list[str]] = {}
    for line in body.splitlines():
        if line.startswith("Porter-") and ": " in line:
            k, v = line.split(": ", 1)
            out.setdefault(k, []).append(v.strip())
    return out


def dirty_paths(workspace: Path, under: str) -> list[str]:
    """Paths under `under` that differ from HEAD (modified, added, deleted, untracked)."""
    out = git(workspace, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", under)
    paths = []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if not e:
            continue
        status, p = e[:2], e[3:]
        if status[0] in "RC":  # rename/copy: the source path follows
            i += 1
        paths.append(p)
    return paths


def read_blobs(workspace: Path, specs: list[str]) -> dict[str, bytes | None]:
    """The contents of `<rev>:<path>` specs (a path starting ./ is relative to `workspace`) in one
    `git cat-file --batch`; None for a spec that names no blob (missing, a tree, a submodule)."""
    if not specs:
        return {}
    r = _run(workspace, ["cat-file", "--batch"], input=b"".join(s.encode() + b"\n" for s in specs))
    data, pos, out = r.stdout, 0, {}
    for spec in specs:
        nl = data.find(b"\n", pos)
        if nl < 0:
            out[spec] = None
            continue
        header, pos = data[pos:nl].split(), nl + 1
        if len(header) == 3 and header[2].isdigit():  # "<oid> <type> <size>", then the content and a newline
            size = int(header[2])
            out[spec] = data[pos:pos + size] if header[1] == b"blob" else None
            pos += size + 1
        else:  # "<spec> missing" or "ambiguous"
            out[spec] = None
    return out


def last_commit_touching(workspace: Path, rev: str, rel: str) -> str | None:
    """The newest commit reachable from `rev` that touched `rel` (relative to `workspace`), or None."""
    r = _run(workspace, ["log", "-1", "--format=%H", rev, "--", rel], text=True)
    return (r.stdout.strip() or None) if r.returncode == 0 else None
