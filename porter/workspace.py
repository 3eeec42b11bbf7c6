"""Workspaces: git repositories holding targets/, ledger/, runs/ and the ported units.

`porter init DIR` makes one from the bundled targets (or a target folder of the user's) and marks it
with .porter-workspace, committed.  The commands that write (run, optimize, repair, calibrate with
its ledger records) run only in a workspace porter made: never in porter's own source checkout,
which holds targets/ and ledger/ too (the read commands and the developer tools use its bundled
targets there), nor in a repository of the user's that merely looks like one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from porter.records import gitops
from porter.records import signing
from porter.records import witness
from porter.errors import PorterError
from porter.target.placeholder import placeholder_source

GITIGNORE = """\
# porter: per-run artifacts (prompts, responses, build cache, lock) are never committed
runs/
__pycache__/
*.o
*.so
*.gguf
"""

LEDGER_README = """\
Append-only, hash-chained, Ed25519-signed ledger of porter's attempts and gate verdicts
(ledger.jsonl; the key's public half is signer.pub), and the content-addressed evidence
files they point to (evidence/<sha256>.json).
Written only by `porter run`; read by `porter status` and `porter audit`.
"""

RUNS_README = "runs/ holds per-run artifacts (prompts, responses, build logs, fixtures); git ignores it.\n"

# `porter init` marks the workspace it made (committed: a clone of it is one too); workspaces made
# before the mark are known by their first commit's subject
MARKER = ".porter-workspace"
MARKER_TEXT = ("made by `porter init`: porter's writing commands (run, optimize, repair) run only in a "
               "repository holding this file\n")
NEW_WORKSPACE = "new workspace for"

# What a bundled target folder may hold that a fresh workspace must not inherit.
_NOT_COPIED = ("ported", "__pycache__", "*.o", "*.so", "*.gguf", "build")


def bundled_targets_dir() -> Path:
    """The targets/ folder next to the porter package (this repository's)."""
    return Path(__file__).resolve().parents[1] / "targets"


def bundled_targets() -> list[str]:
    d = bundled_targets_dir()
    return sorted(p.parent.name for p in d.glob("*/target.toml")) if d.is_dir() else []


def example_target() -> str:
    """The bundled example target: the one that runs without a user's checkout (its target.toml names a
    default_checkout).  `porter init` and the developer commands default to it, so no name is written here."""
    import tomllib

    found = [n for n in bundled_targets() if "default_checkout" in
             tomllib.loads((bundled_targets_dir() / n / "target.toml").read_text()).get("source", {})]
    if len(found) != 1:
        raise PorterError(f"bundled targets with their own checkout: {', '.join(found) or 'none'}; pass --target")
    return found[0]


def is_workspace(path: Path) -> bool:
    return (path / "targets").is_dir() and (path / "ledger").is_dir()


def is_porter_source(path: Path) -> bool:
    """Whether `path` is a checkout of porter itself (its package and its pyproject.toml at the top)."""
    import tomllib

    path = Path(path)
    if not (path / "porter" / "__init__.py").is_file() or not (path / "pyproject.toml").is_file():
        return False
    try:
        return tomllib.loads((path / "pyproject.toml").read_text()).get("project", {}).get("name") == "porter"
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def not_made_by_porter(workspace: Path) -> str | None:
    """Why porter must not write in `workspace`; None when `porter init` made it."""
    ws = Path(workspace)
    if is_porter_source(ws):
        return (f"{ws} is porter's own source checkout, not a workspace: make one with `porter init DIR` and run "
                "there (-C DIR)")
    if (ws / MARKER).is_file():
        return None
    top = gitops.toplevel(ws)
    if top is not None and gitops.head(top) is not None:
        roots = gitops.git(top, "log", "--max-parents=0", "--format=%s", "HEAD", check=False)
        if any(line.startswith(f"porter: {NEW_WORKSPACE} ") for line in roots.splitlines()):
            return None  # made by a porter from before the mark
    return (f"{ws} was not made by `porter init` (it has no {MARKER}): porter writes commits only in a workspace "
            "it made; make one with `porter init DIR`")


def require_made_by_porter(workspace: Path) -> None:
    """A one-line error (exit 2) where porter must not write (see not_made_by_porter)."""
    why = not_made_by_porter(workspace)
    if why is not None:
        raise PorterError(why)


def find_workspace(directory: str | Path | None = None) -> Path:
    """The workspace: `directory` (from -C) or the git toplevel of the current directory."""
    if directory is not None:
        d = Path(directory).expanduser()
        if not d.is_dir():
            raise PorterError(f"-C {directory}: no such directory")
        top = gitops.toplevel(d)
        cand = top if top is not None and is_workspace(top) else d.resolve()
        if not is_workspace(cand):
            raise PorterError(f"{d} is not a porter workspace (it needs targets/ and ledger/); make one with `porter init DIR`")
        return cand
    cwd = Path.cwd()
    top = gitops.toplevel(cwd)
    if top is None or not is_workspace(top):
        raise PorterError(
            "not inside a porter workspace (a git repository with targets/ and ledger/ at its top); "
            "make one with `porter init DIR` or pass -C DIR"
        )
    return top


def default_target(workspace: Path) -> str:
    names = sorted(p.parent.name for p in (workspace / "targets").glob("*/target.toml"))
    if len(names) == 1:
        return names[0]
    if not names:
        raise PorterError(f"workspace {workspace} has no target (targets/<name>/target.toml)")
    raise PorterError(f"workspace has several targets ({', '.join(names)}): pass --target NAME")


def write_placeholders(workspace: Path, target_name: str, only_missing: bool = True, source=None) -> list[Path]:
    """Generate the placeholder file of every unit (those without a file, unless only_missing=False)."""
    from porter.target import load_target

    target = load_target(workspace, target_name, source)
    written = []
    for unit in target.units:
        path = target.unit_path(unit)
        if only_missing and path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(placeholder_source(target.api_function(unit), target.conventions_header.name,
                                           target.spec.cuda.rules.failure_return))
        written.append(path)
    return written


def target_folder(name_or_path: str) -> tuple[str, Path]:
    """(target name, folder to copy) for `porter init --target`: a bundled target's name, or the path of a
    folder holding a target.toml (a target of your own; its name is the one its target.toml declares)."""
    import tomllib

    from porter.target import read_spec

    p = Path(name_or_path).expanduser()
    if (p / "target.toml").is_file():
        try:
            name = tomllib.loads((p / "target.toml").read_text()).get("name")
        except tomllib.TOMLDecodeError as exc:
            raise PorterError(f"malformed {p / 'target.toml'}: {exc}") from exc
        if not isinstance(name, str) or not name or "/" in name:
            raise PorterError(f"{p / 'target.toml'} declares no usable name")
        read_spec(p / "target.toml")  # its problems named in the user's file, not in the workspace's copy
        return name, p.resolve()
    known = bundled_targets()
    if name_or_path not in known:
        raise PorterError(f"no bundled target {name_or_path!r} and no folder with a target.toml there "
                          f"(bundled: {', '.join(known) or 'none'})")
    return name_or_path, bundled_targets_dir() / name_or_path


def init_workspace(directory: str | Path, targets: list[str], source: str | Path | None = None) -> Path:
    """Create a workspace at `directory` holding copies of `targets` (bundled names or target folders)."""
    dest = Path(directory).expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        raise PorterError(f"{dest} exists and is not a directory")
    if dest.exists() and any(dest.iterdir()):
        raise PorterError(f"{dest} is not empty; `porter init` makes a workspace in a new or empty directory")
    folders = dict(target_folder(t) for t in targets)
    target_names = list(folders)

    existed = dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        gitops.init_repo(dest)
        for name in target_names:
            shutil.copytree(folders[name], dest / "targets" / name, ignore=shutil.ignore_patterns(*_NOT_COPIED))
        (dest / "ledger").mkdir()
        (dest / "ledger" / "README.md").write_text(LEDGER_README)
        (dest / "runs").mkdir()
        (dest / "runs" / "README.md").write_text(RUNS_README)
        (dest / ".gitignore").write_text(GITIGNORE)
        for name in target_names:
            write_placeholders(dest, name, source=source)
        if source is not None:
            remember_sources(dest, {name: Path(source).expanduser().resolve() for name in target_names})
        # every record this workspace's ledger will hold is signed with this user's key (made now
        # when there is none, outside the workspace); its public half is committed with the workspace
        signing.write_workspace_key(dest, signing.create_private(dest))
        (dest / MARKER).write_text(MARKER_TEXT)
        gitops.git(dest, "add", "-A")
        gitops.git(dest, *gitops.signing_args(dest), "commit", "-q", "--no-verify", "-m",
                   f"porter: {NEW_WORKSPACE} {', '.join(target_names)} (all units placeholders)")
        witness.new_workspace(dest)
    except BaseException:
        # Leave nothing half-made behind: the directory was new or empty.
        if existed:
            for child in dest.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def remember_sources(workspace: Path, sources: dict[str, Path]) -> Path:
    """porter.toml: the checkout each target was initialised with (read by target.load_target)."""
    import json

    from porter.target import WORKSPACE_FILE

    lines = ["# written by `porter init --source`: where this workspace's target sources are checked out;",
             "# --source DIR or PORTER_<TARGET>_SOURCE override it", "[sources]"]
    lines += [f"{json.dumps(name)} = {json.dumps(str(path))}" for name, path in sources.items()]  # TOML basic strings
    path = workspace / WORKSPACE_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


