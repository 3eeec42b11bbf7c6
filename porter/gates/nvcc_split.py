"""nvcc's own steps for one `nvcc -c`, with the host and device front ends run side by side.

nvcc runs its steps one after another.  For a one-architecture `-c` they are
(`nvcc --dryrun` lists them):

    host:    gcc -E  ->  cudafe++                       (writes the .cudafe1.cpp and stub)
    device:  gcc -E  ->  cicc  ->  ptxas  ->  fatbinary (writes the .fatbin.c the stub includes)
    then:    gcc -c  on the .cudafe1.cpp                (the object)

The two chains only meet in the final gcc -c, except for one file: cudafe++
writes the module id (`--gen_module_id_file`) that cicc then reads.  We write
that id ourselves first (in nvcc's shape: `_<hex>_<len>_<stem>_cu_<hex>`) and
let both read it, so the chains are independent.  Measured on a unit of
minimoe (2-core machine): 1.24-1.43 s with plain nvcc, 0.87-0.90 s split.

Each chain runs as one `bash -c` in the compiler's sandbox (compile_jail.py):
one bwrap start per chain, not per tool.

Anything but that exact shape (several architectures, -rdc, -E, another nvcc
whose dryrun reads differently) runs plain nvcc.  A step that fails makes the
caller run plain nvcc again, so compile diagnostics are always nvcc's own, in
nvcc's order.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from porter.gates import compile_jail, host_pch

_ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_MODULE_ID = re.compile(r'--module_id_file_name "([^"]+)"')


@dataclass
class SplitPlan:
    env: dict[str, str]
    host: list[str]  # gcc -E, cudafe++
    device: list[str]  # gcc -E, cicc, ptxas, fatbinary
    final: str  # gcc -c
    module_id_file: str
    tmpdir: Path
    jail: compile_jail.Jail  # every step reads candidate text: each chain runs in this sandbox


def output_of(nvcc_cmd: list[str]) -> list[str]:
    """The command's `-o` file, as a list of none or one (it varies from build to build)."""
    return [nvcc_cmd[nvcc_cmd.index("-o") + 1]] if "-o" in nvcc_cmd[:-1] else []


def tool_name(cmd: str) -> str:
    first = cmd.split(None, 1)[0].strip('"')
    return Path(first).name


def plan(nvcc_cmd: list[str], cwd: Path, rw: list[Path] = ()) -> SplitPlan | None:
    """nvcc's steps for this compile, or None when they are not the shape we know how to split.
    `rw`: folders besides cwd and the output's that the steps write (the precompiled headers)."""
    jail = compile_jail.for_command(nvcc_cmd, cwd, rw)
    tmpdir = Path(tempfile.mkdtemp(prefix=".nvcc-split-", dir=cwd))
    # nvcc names its temporaries after its own pid under $TMPDIR: a private TMPDIR keeps them
    # apart from every other compile running now (the dryrun's pid is free again at once)
    env = compile_jail.clean_env(TMPDIR=str(tmpdir))
    # tmpdir lies inside cwd: it is named first, so cwd's own occurrences are what is left
    steps = dryrun_cached(nvcc_cmd, env, cwd, [str(tmpdir), *output_of(nvcc_cmd), str(cwd)])
    tools = [tool_name(s) for s in steps or []]
    expected = ["gcc", "cudafe++", "gcc", "cicc", "ptxas", "fatbinary", "rm", "gcc"]
    if steps is None or tools != expected:
        shutil.rmtree(tmpdir, ignore_errors=True)
        return None
    pp_host, cudafe, pp_dev, cicc, ptxas, fatbin, _rm, final = steps
    ids = {m for s in (cudafe, cicc) for m in _MODULE_ID.findall(s)}
    if (" -E " not in f" {pp_host} " or " -E " not in f" {pp_dev} " or "-D__CUDA_ARCH__=" not in pp_dev
            or " -c " not in f" {final} " or "--gen_module_id_file" not in cudafe or len(ids) != 1
            or not next(iter(ids)).startswith(str(tmpdir))):
        shutil.rmtree(tmpdir, ignore_errors=True)
        return None
    return SplitPlan(env, [pp_host, cudafe.replace("--gen_module_id_file", "", 1)],
                     [pp_dev, cicc, ptxas, fatbin], final, next(iter(ids)), tmpdir, jail)


def dryrun(nvcc_cmd: list[str], env: dict, cwd: Path | None = None) -> list[str] | None:
    """The commands `nvcc --dryrun` lists for nvcc_cmd, in order; the environment lines it prints
    are set in `env`.  None when nvcc cannot say (it fails, hangs or is not there)."""
    try:
        r = subprocess.run([*nvcc_cmd, "--dryrun"], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    steps: list[str] = []
    for line in r.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:].strip()
        m = _ENV_LINE.match(body)
        if m:
            try:
                env[m.group(1)] = " ".join(shlex.split(m.group(2)))
            except ValueError:
                env[m.group(1)] = m.group(2).strip()
            continue
        steps.append(body)
    return steps


_DRYRUNS: dict = {}  # templated (command, cwd, environment) -> templated (steps, environment lines)
_DRYRUNS_LOCK = threading.Lock()


def dryrun_cached(nvcc_cmd: list[str], env: dict, cwd: Path | None, variables: list[str]) -> list[str] | None:
    """dryrun(), asked of nvcc once per command shape: a command that differs from an earlier one
    only in `variables` (this compile's private TMPDIR, output and folder) gets the earlier steps
    with its own strings put back.  nvcc's listing is a function of its arguments, folder and
    environment alone (measured: 11-15 ms of nvcc per ask, on the critical path of every unit
    build and link).  Variables are replaced in the order given, so one that contains another
    comes first; nvcc's temporary names keep the first ask's pid, which is safe in a private TMPDIR."""
    marks = [(v, f"\0{i}\0") for i, v in enumerate(variables) if v]

    def template(text: str) -> str:
        for v, m in marks:
            text = text.replace(v, m)
        return text

    def fill(text: str) -> str:
        for v, m in marks:
            text = text.replace(m, v)
        return text

    key = (tuple(map(template, nvcc_cmd)), template(str(cwd)) if cwd is not None else None,
           tuple(sorted((k, template(v)) for k, v in env.items())))
    with _DRYRUNS_LOCK:
        known = _DRYRUNS.get(key)
    if known is not None:
        steps, lines = known
        env.update({k: fill(v) for k, v in lines.items()})
        return [fill(s) for s in steps]
    before = dict(env)
    steps = dryrun(nvcc_cmd, env, cwd)
    if steps is None:  # not remembered: a failure may be passing (a timeout, a missing file)
        return None
    lines = {k: v for k, v in env.items() if before.get(k) != v}
    with _DRYRUNS_LOCK:
        _DRYRUNS[key] = ([template(s) for s in steps], {k: template(v) for k, v in lines.items()})
    return steps


def module_id(key: str, stem: str) -> str:
    """An id in nvcc's shape, unique per object key (it names the unit's anonymous namespace)."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", stem)
    return f"_{key[:8]}_{len(safe) + 3}_{safe}_cu_{key[8:16]}"


def run_split(p: SplitPlan, cwd: Path, timeout: float, pch_dir: Path | None = None,
              step_ms: dict[str, float] | None = None) -> str:
    """The plan's steps, the two chains side by side, then the host compile: "ok", "failed"
    (a step exited non-zero) or "timeout".  With `pch_dir`, the host compile reads the
    prefix every unit shares from a precompiled header cached there (host_pch.py).  With
    `step_ms`, each step's wall time is put there under its chain and tool ("device:cicc"),
    and the precompiled prefix's lookup under "host:prefix": where a unit's compile goes."""
    deadline = time.monotonic() + timeout
    times = step_ms if step_ms is not None else {}

    def chain(cmds: list[str], label: str) -> str:
        # one sandbox runs the whole chain; each step's start and end are stamped into a file
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        stamps = p.tmpdir / f"steps-{label}-{time.monotonic_ns()}"
        script = "".join(f"t=$EPOCHREALTIME\n{c}\ns=$?; [ $s = 0 ] || exit $s; echo \"$t $EPOCHREALTIME\" >> "
                         f"{shlex.quote(str(stamps))}\n" for c in cmds)
        t0 = time.monotonic()
        try:
            r = p.jail.run(["bash", "-c", script], p.env, cwd, left)
        except subprocess.TimeoutExpired:
            return "timeout"
        finally:
            _record_steps(times, label, cmds, stamps, time.monotonic() - t0)
        return "ok" if r.returncode == 0 else "failed"

    def host_then_prefix() -> tuple[str, host_pch.PrecompiledCompile | None]:
        # cudafe++ has written the .cudafe1.cpp the host compile reads (cicc writes other files):
        # its prefix is cut and found (or precompiled) here, while the device chain still runs
        done = chain(p.host, "host")
        if done != "ok" or pch_dir is None:
            return done, None
        t0 = time.monotonic()
        found = host_pch.precompiled_final(p.final, cwd, p.env, pch_dir, deadline,
                                           Path(p.module_id_file).read_text().strip(), p.jail)
        times["host:prefix"] = round((time.monotonic() - t0) * 1000, 1)
        return done, found

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            host, device = pool.submit(host_then_prefix), pool.submit(chain, p.device, "device")
            (host_done, pch), device_done = host.result(), device.result()
        for bad in ("timeout", "failed"):
            if bad in (host_done, device_done):
                return bad
        if pch is not None and chain([pch.command], "final") == "ok":
            return "ok"
        # no precompiled prefix, or its compile failed: nvcc's own host compile decides
        plain = chain([p.final], "final")
        if pch is not None and plain == "ok":
            host_pch.condemn(pch.header_dir, "the host compile failed with it and passed without")
        return plain
    finally:
        shutil.rmtree(p.tmpdir, ignore_errors=True)


def _record_steps(times: dict[str, float], label: str, cmds: list[str], stamps: Path, wall_s: float) -> None:
    """Each finished step's wall time under "<chain>:<tool>" (a second host compile, the plain one
    after a failed precompiled one, adds to the first), and what the chain spent besides its
    steps, the sandbox's start above all, under "<chain>:sandbox"."""
    try:
        pairs = [ln.replace(",", ".").split() for ln in stamps.read_text().splitlines()]
    except OSError:
        pairs = []
    spent = 0.0
    for c, (start, end) in zip(cmds, pairs):
        ms = (float(end) - float(start)) * 1000
        spent += ms
        name = f"{label}:{tool_name(c)}"
        times[name] = round(times.get(name, 0.0) + ms, 1)
    name = f"{label}:sandbox"
    times[name] = round(times.get(name, 0.0) + max(0.0, wall_s * 1000 - spent), 1)


def compile_split(nvcc_cmd: list[str], cwd: Path, key: str, stem: str, timeout: float,
                  pch_dir: Path | None = None, step_ms: dict[str, float] | None = None) -> str:
    """"ok" when the split steps made the object, "unsplit" when this compile is not of the
    shape we split, "failed" (the caller runs plain nvcc, for nvcc's own diagnostics) or "timeout"."""
    t0 = time.monotonic()
    if pch_dir is not None:
        pch_dir.mkdir(parents=True, exist_ok=True)  # bound into the sandbox, so it must exist first
    p = plan(nvcc_cmd, cwd, [pch_dir] if pch_dir is not None else [])
    if p is None:
        return "unsplit"
    if step_ms is not None:
        step_ms["plan"] = round((time.monotonic() - t0) * 1000, 1)
    Path(p.module_id_file).write_text(module_id(key, stem))
    return run_split(p, cwd, timeout, pch_dir, step_ms)

