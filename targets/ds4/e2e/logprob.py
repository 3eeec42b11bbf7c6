"""ds4's own end-to-end check on the user's model: `ds4_test --logprob-vectors`.

ds4_test replays the official DeepSeek API vectors (tests/test-vectors/
official.vec): for each case it encodes the prompt, prefills, and for each step
checks that the greedy token is the official one and that every official
top-20 token is in the local top-20 within 4 nats.  Its stderr, per case:

    ds4-test: vector <id>
    ds4-test: vector <id> step <i> selected token mismatch
    ds4-test: vector <id> step <i> official top token missing locally
    ds4-test: vector <id> step <i> logprob delta too high: local=<x> official=<y>
    ds4-test: vector <id> skipped (API/official graph mismatch)
    <file>:<line>: assertion failed: <expr>
    logprob-vectors: OK | ERR
and on stdout "ds4 tests: ok" (or stderr "ds4 tests: <n> failure(s)").

porter builds ds4_test from a scratch copy of the user's checkout with the
CUDA backend from porter's workspace (the library in place of ds4_cuda.o),
runs it with DS4_TEST_MODEL=<the real GGUF>, and records the parsed result as
e2e evidence.  The model is 80+ GB, so this runs only where the user has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from porter.target_code import sibling

_CASE = re.compile(r"^ds4-test: vector (\S+)$")
_SKIP = re.compile(r"^ds4-test: vector (\S+) skipped \((.*)\)$")
_STEP = re.compile(r"^ds4-test: vector (\S+) step (\d+) (.*)$")
_ASSERT = re.compile(r"^(\S+:\d+): assertion failed: (.*)$")
_VERDICT = re.compile(r"^logprob-vectors: (OK|ERR)\b")
_DELTA = re.compile(r"local=(\S+) official=(\S+)")


def _driver():
    """e2e/driver.py beside this file (it builds the scratch copy ds4_test is made in)."""
    return sibling(__file__, "driver")


@dataclass
class VectorCase:
    id: str
    status: str = "ok"  # ok | failed | skipped
    problems: list[str] = field(default_factory=list)
    max_delta: float | None = None  # largest |local - official| logprob reported over the limit


@dataclass
class LogprobResult:
    ok: bool
    cases: list[VectorCase]
    verdict: str | None  # ds4_test's own OK / ERR line
    exit_code: int
    summary: str

    def to_json(self) -> dict:
        return {"ok": self.ok, "verdict": self.verdict, "exit_code": self.exit_code, "summary": self.summary,
                "cases": [{"id": c.id, "status": c.status, "problems": c.problems[:20], "max_delta": c.max_delta}
                          for c in self.cases]}


def build_command(build_dir: Path, library: Path | None, cuda_arch: str = "sm_90", jobs: int = 16) -> list[str]:
    """make ds4_test in the scratch copy (porter's patched copy: it links our accessor, inert unless
    its environment asks); with `library`, porter's backend replaces ds4_cuda.o."""
    backend = str(Path(library).resolve()) if library is not None else "ds4_cuda.o"
    cmd = ["make", "-C", str(build_dir), "-f", "Makefile", "-f", _driver().MAKE_FRAGMENT, f"-j{jobs}",
           "ds4_test",
           f"CUDA_ARCH={cuda_arch}", f"CORE_OBJS=ds4.o ds4_e2e_accessor.o {backend}"]
    if library is not None:
        lib = Path(library).resolve()
        cmd.append("CUDA_LDLIBS=-lm -Xcompiler -pthread -L$(CUDA_HOME)/lib64 -lcudart -lcublas "
                   f"-Xlinker -rpath -Xlinker {lib.parent}")
    return cmd


def run_command(build_dir: Path, model: Path, vector_file: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for the run; the cwd is build_dir (vector paths are relative to it)."""
    env = {"DS4_TEST_MODEL": str(Path(model).resolve())}
    if vector_file is not None:
        env["DS4_TEST_VECTOR_FILE"] = str(Path(vector_file).resolve())
    return [str(Path(build_dir) / "ds4_test"), "--logprob-vectors"], env


def parse_output(stdout: str, stderr: str, exit_code: int) -> LogprobResult:
    cases: dict[str, VectorCase] = {}
    current: VectorCase | None = None
    verdict = None
    for raw in stderr.splitlines():
        line = raw.strip()
        if m := _SKIP.match(line):
            cases[m.group(1)] = VectorCase(m.group(1), "skipped", [m.group(2)])
            current = None
        elif m := _STEP.match(line):
            c = cases.setdefault(m.group(1), VectorCase(m.group(1)))
            c.status = "failed"
            c.problems.append(f"step {m.group(2)}: {m.group(3)}")
            if d := _DELTA.search(m.group(3)):
                try:
                    delta = abs(float(d.group(1)) - float(d.group(2)))
                    c.max_delta = max(c.max_delta or 0.0, delta)
                except ValueError:
                    pass
        elif m := _CASE.match(line):
            current = cases.setdefault(m.group(1), VectorCase(m.group(1)))
        elif m := _ASSERT.match(line):
            target = current or cases.setdefault("(setup)", VectorCase("(setup)"))
            target.status = "failed"
            target.problems.append(f"assertion failed: {m.group(2)} ({m.group(1)})")
        elif m := _VERDICT.match(line):
            verdict = m.group(1)
    ran = [c for c in cases.values() if c.status != "skipped"]
    failed = [c for c in cases.values() if c.status == "failed"]
    all_ok_line = "ds4 tests: ok" in stdout
    ok = exit_code == 0 and verdict == "OK" and all_ok_line and bool(ran) and not failed
    if ok:
        summary = f"ds4_test --logprob-vectors: {len(ran)} official vectors match" + (
            f" ({len(cases) - len(ran)} skipped by ds4_test)" if len(cases) > len(ran) else "")
    elif not ran and not failed:
        summary = f"ds4_test --logprob-vectors ran no vector (exit {exit_code})"
    else:
        first = failed[0] if failed else None
        summary = (f"ds4_test --logprob-vectors failed: {len(failed)}/{len(ran)} vectors"
                   + (f"; {first.id}: {first.problems[0]}" if first and first.problems else "")
                   + ("" if verdict else "; no verdict line (crashed?)") + f" (exit {exit_code})")
    return LogprobResult(ok, list(cases.values()), verdict, exit_code, summary)


FULL_LAYERS = 43  # the real model: the scratch copy keeps ds4's own layer count
RUN_TIMEOUT_S = 3600


def run_logprob_vectors(target, workspace: Path, library: Path, model: Path, scratch: Path, *,
                        cuda_arch: str | None = None, store: bool = True):
    """Build ds4_test against `library` (porter's workspace backend) and run the official vectors on the
    user's model; a GateResult('e2e') whose evidence names the backend tree it ran on."""
    import subprocess
    import time

    from porter.errors import PorterError
    from porter.gates.e2e import tree
    from porter.digest import sha256_file
    from porter.gates.e2e.gate import UNIT
    from porter.toolchain import host_facts
    from porter.gates.result import GateResult

    model = Path(model)
    if not model.is_file():
        return GateResult("e2e", False, f"logprob vectors skipped: no model at {model}", skipped=True)
    build = _driver().scratch_copy(target, Path(scratch) / "ds4-full", FULL_LAYERS)
    cmd = build_command(build, library, cuda_arch or target.arch.archs[-1])  # the GPU it runs on (porter.arch)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PorterError(f"ds4_test build failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    argv, env_extra = run_command(build, model)
    from porter import sandbox
    from porter.gates.e2e import cbuild

    t0 = time.monotonic()
    try:
        run = cbuild.run_engine(argv, reads=[model, Path(library).resolve()], writes=[build], env=env_extra,
                                cwd=build, timeout=RUN_TIMEOUT_S)
        result = parse_output(run.stdout, run.stderr, run.returncode)
    except subprocess.TimeoutExpired:
        result = LogprobResult(False, [], None, 124, f"ds4_test --logprob-vectors ran past {RUN_TIMEOUT_S}s")
    wall = time.monotonic() - t0
    ws = Path(workspace)
    dirs = tree.backend_dirs(target)
    head = tree.head_commit(ws)
    th = tree.tree_hash_worktree(ws, dirs)
    ev = {"target": target.name, "unit": UNIT, "gate": "e2e", "kind": "ds4-logprob-vectors", "ok": result.ok,
          "candidate_sha256": sha256_file(Path(library)), "tree_hash": th, "commit": head,
          "tree_matches_head": head is not None and th == tree.tree_hash_at(ws, dirs, head),
          "model": {"path": str(model), "bytes": model.stat().st_size}, "result": result.to_json(),
          "command": argv, "wall_s": round(wall, 1), "toolchain": host_facts(),
          "sandbox": sandbox.label()}
    metrics = {"ok": result.ok, "wall_s": round(wall, 1)}
    if store:
        from porter.evidence import store_evidence

        metrics["evidence_sha256"] = store_evidence(ws, ev)
    return GateResult("e2e", result.ok, result.summary[:400], metrics=metrics, evidence=ev)
