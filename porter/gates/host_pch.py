"""A precompiled header for the host compile that ends every nvcc `-c`.

nvcc's last step is `gcc -c` on cudafe++'s output (the `.cudafe1.cpp`): about
42,000 lines, of which all but the last few hundred are the CUDA runtime, the
libstdc++ and the target's conventions header that every unit of a target
force-includes, identical from one unit to the next.  gcc spends 90% of that
step parsing them (measured: 0.25-0.38 s of the step's 0.28-0.40 s, minimoe's
bench unit, 2-core machine).  So the file is cut where its text first returns
to the unit's own source, or earlier, before the first anonymous namespace that
cudafe++ names after this compile's module id (libcu++'s headers, which ds4's
conventions header includes, have them); the part before the cut (the prefix)
is precompiled once per (prefix text, host compile flags, gcc) and cached, and
the compile reads the unit's part behind `#include "<cache>/prefix.h"`.

The cut changes no byte the compiler sees: prefix.h holds exactly the prefix's
lines and the unit's file the rest, so with or without the .gch the text is
the same.  gcc uses the .gch only when it is valid for the compile at hand and
parses prefix.h as text otherwise, so a stale or foreign .gch costs time,
never a different object.  A prefix that does not precompile (a cut that
leaves a block open), or a .gch that fails a compile the plain host compile
passes (gcc refuses a truncated one outright), is remembered as such and
those compiles stay plain.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from porter.host.keyed_lock import key_lock
from porter.host.toolchain import compiler_identity

_MARKER = re.compile(r'^# \d+ "([^"]*)"')
_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*|[{}]', re.S)
_OPENS = re.compile(r"^#\s*(?:if|ifdef|ifndef)\b|^#pragma GCC (?:diagnostic|visibility) push\b")
_IF0 = re.compile(r"^#\s*if\s+0\s*$")
_CLOSES = re.compile(r"^#\s*endif\b|^#pragma GCC (?:diagnostic|visibility) pop\b")


def _last_top_level_end(lines: list[str]) -> int:
    """The largest i such that lines[:i] closes every brace, #if and pragma push it opens: a
    prefix that ends there is a header gcc can precompile.  Text under `#if 0` (where cudafe++
    puts device code) is not compiled, so its braces do not count."""
    depth, skipped, best = 0, 0, 0
    for i, line in enumerate(lines):
        if line.startswith("#"):
            if _OPENS.match(line):
                depth += 1
                if skipped or _IF0.match(line):
                    skipped += 1
            elif _CLOSES.match(line):
                depth -= 1
                skipped = max(0, skipped - 1)
        elif not skipped and ("{" in line or "}" in line):
            for tok in _TOKENS.findall(line):
                if tok == "{":
                    depth += 1
                elif tok == "}":
                    depth -= 1
        if depth == 0:
            best = i + 1
        elif depth < 0:
            break
    return best


def split_prefix(text: str, avoid: str | None = None, memo: Path | None = None) -> tuple[str, str] | None:
    """(prefix, rest) of a .cudafe1.cpp: the prefix ends before the first line marker back into
    the unit's own file (the file its first line names), and before the first line holding
    `avoid` (this compile's module id, which cudafe++ writes into the anonymous namespaces of
    headers: a prefix holding it would be this unit's alone), at the last point where every
    block it opened is closed.  None when the text has no such shape.  `memo`: a folder that
    keeps where that point is per candidate prefix (finding it reads every line: 50 ms)."""
    head_end = text.find("\n")
    first = _MARKER.match(text[:head_end]) if head_end > 0 else None
    if first is None:
        return None
    back = re.compile(r'^# \d+ "' + re.escape(first.group(1)) + '"', re.M).search(text, head_end + 1)
    stops = [back.start() if back else -1]
    if avoid:  # cut before the line that holds the id
        at = text.find(avoid, head_end)
        stops.append(text.rfind("\n", 0, at) + 1 if at >= 0 else -1)
    stops = [x for x in stops if x > head_end]
    if not stops:
        return None
    stop = min(stops)
    candidate = text[head_end + 1:stop]
    key = hashlib.sha256(candidate.encode("utf-8", "surrogateescape")).hexdigest()
    end = None
    if memo is not None and (memo / key).is_file():
        try:
            end = int((memo / key).read_text())
        except ValueError:
            end = None
    if end is None:
        lines = candidate.split("\n")[:-1]  # the candidate ends with its last line's newline
        end = sum(len(line) + 1 for line in lines[:_last_top_level_end(lines)])
        if memo is not None:
            memo.mkdir(parents=True, exist_ok=True)
            tmp = memo / f".{key}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(str(end))
            os.replace(tmp, memo / key)
    if end <= 0 or end > len(candidate):
        return None
    # line 0 (the unit's own marker) stays in the unit's file: the prefix is then the same
    # text for every unit, and so is its cache key
    return candidate[:end], text[:head_end + 1] + text[head_end + 1 + end:]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, jail) -> subprocess.CompletedProcess | None:
    try:
        return jail.run(["bash", "-c", shlex.join(argv)], env, cwd, max(timeout, 0.01))
    except subprocess.TimeoutExpired:
        return None


@dataclass
class PrecompiledCompile:
    command: str  # the host compile, reading the prefix through the precompiled header
    header_dir: Path  # the cached prefix.h and prefix.h.gch it reads


def precompiled_final(final: str, cwd: Path, env: dict[str, str], pch_dir: Path, deadline: float,
                      module_id: str | None, jail) -> PrecompiledCompile | None:
    """nvcc's final host compile (`final`, one shell command) rewritten to read the shared prefix
    from its precompiled header, building and caching that header first (in `jail`, the compile's
    sandbox: the prefix is cudafe++'s output) when it is missing; None when this compile has to
    stay plain (no cut, no precompiled header for its prefix)."""
    try:
        argv = shlex.split(final)
    except ValueError:
        return None
    inputs = [i for i, a in enumerate(argv) if a.endswith(".cudafe1.cpp")]
    if len(inputs) != 1 or "-c" not in argv or "-o" not in argv or any(c in str(pch_dir) for c in '"\\\n'):
        return None
    src = Path(argv[inputs[0]])
    src = src if src.is_absolute() else cwd / src
    try:
        cut = split_prefix(src.read_text(errors="surrogateescape"), module_id, pch_dir / "cuts")
    except OSError:
        return None
    if cut is None:
        return None
    prefix, rest = cut
    out_at = argv.index("-o")
    flags = [a for i, a in enumerate(argv) if i not in (inputs[0], out_at, out_at + 1)]
    digest = hashlib.sha256()
    for part in (prefix, "\0".join(flags), compiler_identity(argv[0], env.get("PATH", os.environ.get("PATH", "")))):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0\0")
    header_dir = pch_dir / digest.hexdigest()
    if not _ensure(header_dir, prefix, flags, env, deadline, jail):
        return None
    unit_file = src.with_name(src.name[: -len(".cudafe1.cpp")] + ".pch-unit.cpp")
    # the stub (#include "<stem>.cudafe1.stub.c") resolves next to the including file: same folder
    unit_file.write_text(f'#include "{header_dir / "prefix.h"}"\n{rest}', errors="surrogateescape")
    argv[inputs[0]] = str(unit_file)
    return PrecompiledCompile(shlex.join(argv), header_dir)


def condemn(header_dir: Path, why: str) -> None:
    """A precompiled prefix that failed a compile nvcc's own host compile passed (a damaged .gch:
    gcc refuses a truncated one rather than reading the text): removed, and not built again."""
    _failed_marker(header_dir).write_text(why[-4000:] or "failed where the plain compile passed")
    shutil.rmtree(header_dir, ignore_errors=True)


def _failed_marker(header_dir: Path) -> Path:
    return header_dir.with_name(header_dir.name + ".failed")


def _ensure(header_dir: Path, prefix: str, flags: list[str], env: dict[str, str], deadline: float, jail) -> bool:
    """The precompiled prefix in `header_dir`, built when missing: False when it cannot be."""
    gch = header_dir / "prefix.h.gch"
    if gch.is_file():
        return True
    if _failed_marker(header_dir).exists():
        return False
    lock = key_lock(str(header_dir))
    # another thread building it: this compile goes plain rather than wait (the first build of a
    # backend compiles every unit at once, and waiting costs as much as the parse it would save)
    if not lock.acquire(blocking=False):
        return False
    try:
        if gch.is_file():
            return True
        header_dir.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{header_dir.name[:16]}-", dir=header_dir.parent))
        try:
            (work / "prefix.h").write_text(prefix, errors="surrogateescape")
            cmd = [a for a in flags if a != "-c"]
            # the host compile reads `-x c++`; its prefix is precompiled as that language's header
            cmd = ["c++-header" if a == "c++" and i and cmd[i - 1] == "-x" else a for i, a in enumerate(cmd)]
            cmd += [str(work / "prefix.h"), "-o", str(work / "prefix.h.gch")]
            r = _run(cmd, work, env, deadline - time.monotonic(), jail)
            if r is None:  # out of time: the plain compile may still make it; try again next time
                return False
            if r.returncode != 0 or not (work / "prefix.h.gch").is_file():
                _failed_marker(header_dir).write_text(
                    (r.stderr or b"").decode("utf-8", "replace")[-4000:] or "no .gch written")
                return False
            work.chmod(0o755)  # mkdtemp's 0700 would keep a shared $PORTER_BUILD_CACHE to its creator
            try:
                os.replace(work, header_dir)  # the whole folder at once: prefix.h never without its .gch
            except OSError:  # another process put it there first
                return gch.is_file()
            return True
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        lock.release()
