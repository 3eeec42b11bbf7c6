"""Runs the parity child in a sandbox, in its own process group, with a time limit.

A candidate may hang (an endless kernel, a deadlock), segfault in host code,
abort, or kill its CUDA context; none of that may take the harness down.  The
child runs as `python child.py PLAN_DIR` inside porter.host.sandbox (bubblewrap),
which shows it the plan folder (writable), the files the plan names and the
child's own folder (read-only) and nothing of the user; on timeout the whole
process group is killed (SIGKILL), and with it the sandbox's pid namespace.
The outcome says what happened in one line, naming the case and the step the
child had reached (from its progress file).

Everything in the plan folder afterwards is the candidate's writing: scrub()
drops links and special files before the parent reads any of it, and reads
are bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from porter.host import sandbox
from porter.gates.parity import link as linkmod

CHILD = Path(__file__).resolve().parent / "child.py"
CHECKER = Path(__file__).resolve().parent / "checker.py"
CHECKER_DIR = "checker"  # the checker's files, moved into the plan folder once no candidate process is left
CHECKER_READY_S = 180.0
CHECKER_FINISH_S = 120.0  # writing outputs.npz of a real-size plan after the runner is gone

SANITIZER_EXIT = 86  # --error-exitcode given to compute-sanitizer
EXIT_MEANING = {2: "bad plan", 3: "CUDA error", 4: "library did not load", 5: "harness error in the child"}
# the child's environment is built from nothing: these are the variables of ours it still reads
PASSED_ENV = ("PORTER_PARITY_HOST_PEAK_GBPS", "PORTER_LAUNCH_TRACE", "LD_PRELOAD")


@dataclass
class ChildOutcome:
    status: str  # "done" | "timeout" | "crash" | "fatal" | "sanitize" | "harness"
    returncode: int | None
    elapsed_s: float
    detail: str  # one line
    results: dict | None = None
    last_step: dict | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    argv: list[str] = field(default_factory=list)
    sandbox: str = "none"  # what the child ran in: the bwrap version, or "none" (--unsafe-no-sandbox)
    # where it ran, said by the harness on that machine (never the child): toolchain.where_facts()
    where: dict = field(default_factory=dict)
    checker: dict | None = None  # the checker's facts (checker.json), None for plans run without one
    waited_s: float = 0.0  # for a slot and the GPU's gate before anything of this plan ran (the pool's queue)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))  # a candidate may write gigabytes
            data = f.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def scrub(plan_dir: Path) -> None:
    """Remove what a candidate may have planted in its writable folder for the parent to trip on:
    a symlink (results.json -> the signing key, read into diagnostics) or a FIFO (a read that
    never returns).  Called once the sandbox is gone; the parent reads only regular files after."""
    for root, dirs, files in os.walk(plan_dir):
        for name in dirs + files:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                os.unlink(p)


def external_files(plan_dir: Path) -> list[str]:
    """Files outside the plan folder the plan names (library, weight maps, a fixture GGUF) and the
    preloaded libraries: what the child must see read-only.  Read before the child starts."""
    return sorted(set(plan_files(plan_dir)) | {p for p in os.environ.get("LD_PRELOAD", "").split()
                                                 if p.startswith("/") and os.path.isfile(p)})


def plan_files(plan_dir: Path) -> list[str]:
    """Files outside the plan folder that plan.json names: what another machine must be sent."""
    try:
        plan = json.loads((plan_dir / "plan.json").read_text())
    except (OSError, ValueError):
        return []
    found: set[str] = set()

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v.startswith("/") and not v.startswith(str(plan_dir) + "/") and os.path.isfile(v):
            found.add(v)

    walk(plan)
    return sorted(found)


def expected_results(plan_dir: Path) -> dict:
    """{case id: number of calls (None: a scenario's)} of the plan, read before the child starts (after,
    plan.json is the candidate's to rewrite): what a complete run must have reported."""
    try:
        plan = json.loads((plan_dir / "plan.json").read_text())
    except (OSError, ValueError):
        return {}
    return {c.get("id"): (len(c["passes"]) if isinstance(c.get("passes"), list) else None)
            for c in plan.get("cases", []) if isinstance(c, dict)}


def unreported(results: dict, expected: dict) -> str | None:
    """The first case or call of the plan a 'complete' results file has no record of."""
    got = {c.get("id"): c for c in results.get("cases", []) if isinstance(c, dict)} \
        if isinstance(results.get("cases"), list) else {}
    for cid, n in expected.items():
        if cid not in got:
            return f"case {cid}"
        passes = got[cid].get("passes")
        if n is not None and (not isinstance(passes, list)
                              or sorted(str(p.get("pass")) for p in passes if isinstance(p, dict))
                              != sorted(str(i) for i in range(n))):
            return f"the calls of case {cid}"
    return None


def child_env() -> dict:
    return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}


def sandboxed(argv: list[str], plan_dir: Path, mode: str, *, rw: list | None = None, ro: list | None = None,
              env: dict | None = None, scratch: list = ()) -> sandbox.Wrapped:
    """argv in the parity sandbox: the child's folder and `ro` read-only, `rw` (default: the plan
    folder) writable, the GPU when mode is cuda; TMPDIR and cupy's kernel cache inside the writable
    folder, so nothing compiled for one candidate is there for the next."""
    rw = rw or [str(plan_dir)]
    tmp = os.path.join(rw[0], ".tmp")
    os.makedirs(tmp, exist_ok=True)
    inside = {**child_env(), "CUPY_CACHE_DIR": os.path.join(tmp, "cupy"), **(env or {})}
    ro_all = [str(CHILD.parent)] + list(ro if ro is not None else external_files(plan_dir))
    return sandbox.wrap(argv, ro=ro_all, rw=rw, gpu=mode == "cuda", env=inside, tmp=tmp, cwd=str(rw[0]),
                        scratch=scratch)


RESULTS_MAX_BYTES = 256 << 20  # results.json is facts per call; more than this is not the child's honest writing


def last_progress(plan_dir: Path) -> dict | None:
    lines = _tail(plan_dir / "progress.jsonl", 64 << 10).splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def describe_step(step: dict | None) -> str:
    if not step:
        return "before the child reported any step"
    parts = []
    if "case" in step:
        parts.append(f"case {step['case']}")
    if "pass_" in step:
        parts.append(f"call {int(step['pass_']) + 1}")
    what = step.get("step", "?")
    return f"at step '{what}'" + (f" ({', '.join(parts)})" if parts else "")


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def child_argv(plan_dir: Path, sanitize: bool = False, python: str | None = None) -> list[str]:
    argv = [python or sys.executable, str(CHILD), str(plan_dir)]
    if sanitize:
        tool = shutil.which("compute-sanitizer") or "compute-sanitizer"
        argv = [tool, "--tool", "memcheck", "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "20",
                "--target-processes", "all"] + argv
    return argv


def run_child(plan_dir: Path, timeout: float, *, argv: list[str] | None = None,
              env: dict | None = None, tool_ro: list[str] = ()) -> ChildOutcome:
    """Run the child on PLAN_DIR (beside a checker for an op plan); never raises for anything the
    candidate does.  `tool_ro`: folders a tool wrapping the child (argv's head: a profiler) needs
    read-only inside the sandbox."""
    plan_dir = Path(plan_dir)
    argv = argv or child_argv(plan_dir)
    out_path, err_path = plan_dir / "child.stdout", plan_dir / "child.stderr"
    clear_outputs(plan_dir)
    if shutil.which(argv[0]) is None:  # inside the sandbox bwrap would say it, as the child's own exit status
        return ChildOutcome("harness", None, 0.0, f"cannot start the parity child: no program {argv[0]}", argv=argv)
    mode, expected = _plan_mode(plan_dir), expected_results(plan_dir)
    ro = external_files(plan_dir) + list(tool_ro)
    chk = CheckerProc(mode, plan_dir.parent, [str(plan_dir)], env=env) if needs_checker(plan_dir) else None
    if chk:
        env = {**(env or {}), linkmod.ENV_FD: str(chk.runner_fd)}
    w = sandboxed(argv, plan_dir, mode, env=env, ro=ro)  # SandboxUnavailable: the gate refuses, the candidate is not blamed
    if chk:
        # started and given the plan before the runner exists: the plan folder is the runner's to write
        chk.start()
        why = chk.start_job(plan_dir, time.monotonic() + CHECKER_READY_S)
        if why:  # no candidate code has run: a harness fault (the gate is skipped), never a verdict
            chk.discard()
            raise CheckerUnavailable(f"the parity checker did not start: {why}")
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(w.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, close_fds=True,
                                    start_new_session=True, env=w.env, cwd=plan_dir,
                                    pass_fds=(chk.runner_fd,) if chk else ())
        except OSError as exc:
            if chk:
                chk.discard()
            return ChildOutcome("harness", None, 0.0, f"cannot start the parity child: {exc.strerror}", argv=argv)
        if chk:
            chk.runner_started()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: only what we started
            except ProcessLookupError:
                pass
            rc = proc.wait()
    if chk:
        chk.finish(time.monotonic() + CHECKER_FINISH_S)
    scrub(plan_dir)
    if chk:
        chk.adopt(plan_dir)
    o = classify(plan_dir, signalled(rc, w), time.monotonic() - t0, timed_out, timeout, argv, expected,
                 checked=chk is not None)
    o.sandbox = w.label
    return o


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group PROC leads (only what porter started: bwrap, and with it the sandbox's
    pid namespace), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


class CheckerUnavailable(RuntimeError):
    """The checker could not be started or given its plan; raised before the runner exists."""


def needs_checker(plan_dir: Path) -> bool:
    """An op plan's verdict data comes from a checker; a scenario's and the runner tests' "call" plans
    run alone (docs/security.md says what that leaves to the candidate's process)."""
    try:
        plan = json.loads((Path(plan_dir) / "plan.json").read_text())
    except (OSError, ValueError):
        return False
    return plan.get("mode") in ("cuda", "host") and plan.get("kind") != "scenario"


def json_line(stream, deadline: float) -> dict | None:
    """The first JSON object line on STREAM before the deadline; None for anything else (EOF, junk, a
    line that never ends).  Raw reads: a buffered readline would wait forever on a partial line."""
    import selectors

    fd, buf = stream.fileno(), b""
    while b"\n" not in buf and len(buf) < 4096:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            if not sel.select(left):
                return None
        chunk = os.read(fd, 4096 - len(buf))
        if not chunk:
            return None
        buf += chunk
    try:
        msg = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


class CheckerProc:
    """The checker beside one runner (checker.py): its own sandbox, which shows it porter's parity
    folder and the plan (read-only) and its own output folder, never a candidate library it could load;
    its end of the socket pair is handed to it at start, the other end to the runner."""

    def __init__(self, mode: str, base: Path, ro: list[str], env: dict | None = None, python: str | None = None):
        """The socket pair and the output folder now (the runner's environment names its end); the
        process on start(), once the runner's sandbox has been made (its folders handed over)."""
        self.out = Path(tempfile.mkdtemp(prefix=".checker-", dir=base))
        self._mine, self._runner_end = linkmod.pair()
        self.runner_fd = self._runner_end.fileno()
        self.mode, self.ro, self.python = mode, list(ro), python
        self.cuda = {k: v for k, v in (env or {}).items() if k.startswith("CUDA_")}
        self.proc = None
        self.hello: dict | None = None

    def start(self) -> None:
        # the host stand-in's declared peak (device facts are the checker's); never LD_PRELOAD: nothing
        # but porter's own code is loaded here
        peak = {k: os.environ[k] for k in ("PORTER_PARITY_HOST_PEAK_GBPS",) if k in os.environ}
        inside = {linkmod.ENV_FD: str(self._mine.fileno()), "CUPY_CACHE_DIR": str(self.out / ".tmp" / "cupy"),
                  **peak, **self.cuda}
        os.makedirs(self.out / ".tmp", exist_ok=True)
        self.wrapped = sandbox.wrap([self.python or sys.executable, str(CHECKER), self.mode],
                                    ro=[str(CHILD.parent)] + self.ro, rw=[str(self.out)], gpu=self.mode == "cuda",
                                    env=inside, tmp=str(self.out / ".tmp"), cwd=str(self.out))
        with open(self.out / "checker.stderr", "wb") as err:
            self.proc = subprocess.Popen(self.wrapped.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, close_fds=True, pass_fds=(self._mine.fileno(),),
                                         start_new_session=True, env=self.wrapped.env)
        self._mine.close()

    def ready(self, deadline: float) -> bool:
        if self.hello is None:
            self.hello = json_line(self.proc.stdout, deadline) or {"ready": False}
        return bool(self.hello.get("ready"))

    def start_job(self, staged: Path, deadline: float) -> str | None:
        """Give the checker the plan at `staged` and wait until it has read all of it; None when it
        has, else why not (one line)."""
        if not self.ready(deadline):
            return (self.hello or {}).get("error") or "no ready line"
        try:
            self.proc.stdin.write((json.dumps({"staged": str(staged), "out": str(self.out)}) + "\n").encode())
            self.proc.stdin.close()
        except OSError as exc:
            return f"cannot hand it the plan: {exc}"
        said = json_line(self.proc.stdout, deadline)
        if not (said or {}).get("loaded"):
            tail = _tail(self.out / "checker.stderr").strip().splitlines()[-1:]
            return f"it did not load the plan{': ' + tail[0] if tail else ''}"
        return None

    def runner_started(self) -> None:
        """The runner holds its end now: the parent's copy goes, so the checker sees the runner's exit."""
        self._runner_end.close()

    def finish(self, deadline: float) -> None:
        self.runner_started()
        json_line(self.proc.stdout, deadline)  # {"finished"} once its files are written, or EOF
        self.kill()

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    def discard(self) -> None:
        self.kill()
        self._mine.close()
        self._runner_end.close()
        shutil.rmtree(self.out, ignore_errors=True)

    def adopt(self, plan_dir: Path) -> None:
        """The checker's folder into the plan folder as CHECKER_DIR, replacing anything the runner left
        under that name: called once no process of the candidate's is left to race the parent."""
        dest = Path(plan_dir) / CHECKER_DIR
        if os.path.lexists(dest):
            if os.path.isdir(dest) and not os.path.islink(dest):
                shutil.rmtree(dest, ignore_errors=True)
            else:
                os.unlink(dest)
        scrub(self.out)
        shutil.rmtree(self.out / ".tmp", ignore_errors=True)
        os.rename(self.out, dest)


def _plan_mode(plan_dir: Path) -> str:
    try:
        return json.loads((plan_dir / "plan.json").read_text()).get("mode", "cuda")
    except (OSError, ValueError):
        return "cuda"


def signalled(rc: int | None, w: sandbox.Wrapped) -> int | None:
    """bwrap reports a child killed by signal N as exit status 128+N: back to Popen's -N."""
    if rc is not None and w.label != "none" and 128 < rc < 128 + 65:
        return 128 - rc
    return rc


def clear_outputs(plan_dir: Path) -> None:
    for name in ("results.json", "progress.jsonl"):
        (plan_dir / name).unlink(missing_ok=True)


def read_checker(plan_dir: Path) -> dict | None:
    try:
        path = Path(plan_dir) / CHECKER_DIR / "checker.json"
        if path.stat().st_size <= RESULTS_MAX_BYTES:
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        pass
    return None


def classify(plan_dir: Path, rc: int | None, elapsed: float, timed_out: bool, timeout: float,
             argv: list[str], expected: dict | None = None, checked: bool = False) -> ChildOutcome:
    """What happened to one run of the child code, from its exit status and its files (fresh or warm).
    `expected`: expected_results() from before the run; a run that says it completed without a
    record of each of them is a crash (a candidate can write results.json and exit 0)."""
    out_path, err_path = plan_dir / "child.stdout", plan_dir / "child.stderr"
    step = last_progress(plan_dir)
    results = None
    try:
        path = plan_dir / "results.json"
        if path.stat().st_size <= RESULTS_MAX_BYTES:
            results = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        results = None
    if not isinstance(results, dict):
        results = None
    o = ChildOutcome("done", rc, elapsed, "", results, step, _tail(out_path), _tail(err_path), argv)
    o.checker = read_checker(plan_dir) if checked else None
    if checked and o.checker is None:
        o.checker = {"cases": [], "complete": False, "violation": "the checker left no record"}
    if timed_out:
        o.status = "timeout"
        o.detail = f"no result after {timeout:.0f} s: killed {describe_step(step)}"
    elif rc is None:
        o.status = "harness"
        o.detail = "the parity worker gave no exit status"
    elif rc == SANITIZER_EXIT and argv[0].endswith("compute-sanitizer"):
        o.status = "sanitize"
        errs = [ln.strip(" =") for ln in (o.stdout_tail + o.stderr_tail).splitlines() if "ERROR SUMMARY" in ln or "Invalid" in ln]
        o.detail = "; ".join(errs[:3]) or "compute-sanitizer reported errors"
    elif rc < 0:
        o.status = "crash"
        o.detail = f"the child died of {signal_name(-rc)} {describe_step(step)}"
    elif rc == 0 and results is not None and results.get("complete") and (
            missing := unreported(results, expected or {})):
        o.status = "crash"
        o.detail = f"the child said it completed, but reported nothing for {missing}: not believed"
    elif rc == 0 and results is not None and results.get("complete") and checked and not o.checker.get("complete"):
        o.status = "crash"
        why = o.checker.get("violation") or "it did not see every call of the plan through"
        o.detail = f"the child said it completed, but the checker disagrees ({why}): not believed"
    elif rc == 0 and results is not None and results.get("complete"):
        o.status = "done"
        o.detail = f"completed in {elapsed:.2f} s"
    elif results is not None and results.get("fatal"):
        o.status = "fatal"
        f = results["fatal"]
        o.detail = f"{f.get('check')}: {f.get('detail')} {describe_step(f.get('at') or step)}"
    elif rc in (5, 2):
        o.status = "harness"
        o.detail = f"parity child failed ({EXIT_MEANING.get(rc)}): {o.stderr_tail.strip().splitlines()[-1:] or ''}"
    else:
        o.status = "crash"
        o.detail = f"the child exited with status {rc} without results {describe_step(step)}"
    return o
