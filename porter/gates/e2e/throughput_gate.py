"""The throughput gate: is the ported backend as fast as upstream's, end to end, in tokens/s?

The target's e2e driver builds its engine's benchmark twice (upstream's backend and the workspace's, from
the same checkout) and hands back a runner; this gate runs them in ABBA rounds on the same GPU, each
run sandboxed and timed by porter from outside, and decides with porter.gates.e2e.throughput: "prefill
fast" and "decode fast", each with its ratio, upstream's own margin and a p-value.  It runs after the
e2e gate passed on the same backend (a fast wrong engine proves nothing), once per backend tree.

The driver's side (porter.gates.e2e.target_driver):
  throughput_runner(target, scratch, library, model, *, prefill_tokens, decode_tokens, log)
      -> an object with `setup` (dict: what was run) and `run(backend) -> throughput.Sample`
  raising compare.ReferenceFailure where upstream cannot be built (skipped) and PorterError where the
  candidate cannot (failed); `run` raises PorterError for a run that fails or writes no report.
  Optionally `logit_rows(backend) -> Path` and `n_vocab`: after the timed runs (so they never perturb
  them) the gate measures the port's accuracy against upstream with them (porter.gates.e2e.accuracy) and
  records it beside the verdict as `accuracy`; it does not change the verdict.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from porter.errors import PorterError
from porter.gates.e2e import accuracy, throughput, tree
from porter.gates.e2e.compare import ReferenceFailure
from porter.gates.e2e.state import E2E_UNIT
from porter.gates.e2e.target_driver import load_driver
from porter.gates.evidence import ThroughputEvidence
from porter.gates.result import GateResult
from porter.host import sandbox, toolchain
from porter.records.evidence import gate_facts

GATE = "throughput"
RUNNER = "throughput_runner"


def run(candidate, ctx) -> GateResult:
    """The driver's shape (a backend gate): ctx.whole_backend() is the backend library to judge."""
    try:
        library = ctx.whole_backend() if ctx.whole_backend is not None else ctx.library
    except PorterError as exc:
        return GateResult(GATE, False, f"throughput failed: {exc}"[:400], check="build")
    return run_throughput(ctx.target, ctx.workspace, Path(library or "/nonexistent"),
                          log=ctx.log or (lambda *_: None))


def _skipped(why: str) -> GateResult:
    return GateResult(GATE, False, f"throughput skipped: {why}"[:400], skipped=True)


def run_throughput(target, workspace: Path, library: Path | None, *, scratch: Path | None = None,
                   model: Path | None = None, log=print) -> GateResult:
    """The verdict on `library` against upstream; library None runs upstream against itself (the A/A
    check a driver's command offers: the same engine both sides, which must come out fast)."""
    spec = target.spec.e2e.throughput if target.spec.e2e is not None else None
    if spec is None:
        return _skipped(f"target {target.name} declares no [e2e.throughput]")
    if library is not None and not Path(library).is_file():
        return _skipped(f"no backend library at {library}")
    try:
        make_runner = getattr(load_driver(target), RUNNER, None)
        if not callable(make_runner):
            raise PorterError(f"the e2e driver of {target.name} defines no {RUNNER}")
        sandbox.require()  # the engine runs the backend's host code
    except (PorterError, sandbox.SandboxUnavailable) as exc:
        return _skipped(str(exc))

    ws = Path(workspace)
    dirs = tree.backend_dirs(target)
    tree_hash, head = tree.tree_hash_worktree(ws, dirs), tree.head_commit(ws)
    facts = {"tree_hash": tree_hash, "commit": head,
             "tree_matches_head": tree_hash == (tree.tree_hash_at(ws, dirs, head) if head else None),
             "library": {"path": str(library) if library else "upstream (A/A)"}, "prefill_tokens": spec.prefill_tokens,
             "decode_tokens": spec.decode_tokens, "rounds": spec.rounds}
    if scratch is None:  # porter's own scratch (GBs: the fixture, two builds) goes with the gate
        with tempfile.TemporaryDirectory(prefix=f"porter-throughput-{target.name}-",
                                         ignore_cleanup_errors=True) as tmp:
            return run_throughput(target, workspace, library, scratch=Path(tmp), model=model, log=log)
    scratch = Path(scratch)
    t0 = time.monotonic()
    try:
        runner = make_runner(target, scratch, library and Path(library), model, prefill_tokens=spec.prefill_tokens,
                             decode_tokens=spec.decode_tokens, log=log)
    except ReferenceFailure as exc:
        return _skipped(f"upstream's engine: {exc}")
    except PorterError as exc:
        return _result(target, False, f"throughput failed: the candidate's engine: {exc}", facts, None, [])
    samples: list[throughput.Sample] = []
    order = throughput.abba_order(spec.rounds)
    for i, backend in enumerate(order):
        try:
            samples.append(runner.run(backend))
        except PorterError as exc:
            if backend == throughput.UPSTREAM:
                return _skipped(f"upstream's run {i + 1} of {len(order)}: {exc}")
            return _result(target, False, f"throughput failed: run {i + 1} of {len(order)} ({backend}): {exc}",
                           facts, None, samples)
        log(f"throughput: run {i + 1}/{len(order)} ({backend}): {samples[-1].wall_s:.1f} s")
    verdict = throughput.decide(samples, spec.prefill_tokens, spec.decode_tokens)
    if verdict.skipped:
        return _skipped(verdict.reason.removeprefix("throughput skipped: "))
    if callable(getattr(runner, "logit_rows", None)):
        facts["accuracy"] = accuracy.measure(runner, int(runner.n_vocab), spec.prefill_tokens, log=log)
    facts.update(setup=dict(getattr(runner, "setup", {}) or {}), wall_s=round(time.monotonic() - t0, 3))
    return _result(target, verdict.ok, verdict.reason, facts, verdict, samples)


def _result(target, ok: bool, summary: str, facts: dict, verdict, samples) -> GateResult:
    ev = ThroughputEvidence.record(gate_facts(
        target, E2E_UNIT, GATE, None, toolchain.host_facts(),
        ok=bool(ok), verdict=verdict.to_json() if verdict else None, summary=summary[:400],
        samples=[{"backend": s.backend, "wall_s": s.wall_s, "prefill_tokens": s.prefill_tokens,
                  "prefill_s": s.prefill_s, "decode_tokens": s.decode_tokens, "decode_s": s.decode_s}
                 for s in samples], sandbox=sandbox.label(), **facts))
    return GateResult(GATE, bool(ok), summary[:400], _diagnostics(verdict, facts.get("accuracy")), {"ok": bool(ok)},
                      ev)


def _diagnostics(verdict, acc: dict | None = None) -> str:
    if verdict is None or not verdict.phases:
        return ""
    lines = [f"{'phase':<8} {'upstream t/s':>13} {'port t/s':>10} {'ratio':>7} {'A/A margin':>11} {'p':>7}"]
    for p in verdict.phases:
        lines.append(f"{p.phase:<8} {p.upstream_tps:>13.1f} {p.candidate_tps:>10.1f} {p.ratio:>6.2f}x "
                     f"{p.margin:>10.1%} {p.p_value:>7.3f}")
    line = accuracy.accuracy_line(acc)
    return "\n".join(lines + ([line] if line else []))
