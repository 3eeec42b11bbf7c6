"""The e2e gate: the target's engine on the workspace's backend vs the reference backend, one prefill.

run_e2e has the target's driver (porter.gates.e2e.target_driver) build the
engine twice in a scratch folder (reference backend; candidate = the
workspace's CUDA library) and run the same prefill on both, then
compares the residual stream per stage and token, and decides with the
target's calibrated rule (porter.gates.e2e.calibration).  A rule that is
missing, does not hold, or was calibrated for another setup (model, prompt,
stages, engine source) makes the gate *skipped*, never ok.

The evidence names the backend tree hash (porter.gates.e2e.tree) of the
sources on disk when it ran, so status can tie "prefill verified" to exactly
the code at HEAD.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from porter.host import sandbox
from porter.host import toolchain
from porter.digest import sha256_file
from porter.records.evidence import gate_facts
from porter.gates.evidence import E2EEvidence
from porter.errors import PorterError
from porter.gates.e2e import calibration as cal_mod
from porter.gates.e2e import tree, unchanged
from porter.gates.e2e.compare import ReferenceFailure, compare, worst
from porter.gates.e2e.rule import Verdict, decide
from porter.gates.e2e.state import E2E_UNIT
from porter.gates.e2e.target_driver import load_driver
from porter.gates.result import GateResult

GATE = "e2e"


@dataclass
class E2EOptions:
    scratch: Path | None = None  # build/run folder (default: a fresh temp folder)
    model: Path | None = None  # the model the engine runs (default: the target's fixture / synthetic GGUF)
    store: bool = True  # write the evidence into ledger/evidence/
    # e2e evidence records (state.e2e_records_from_ledger) holding the committed backend's: where set, a
    # backend the rule accepts must also be no worse than the committed one (porter.gates.e2e.unchanged)
    committed: list[dict] | None = None
    replacing: dict[str, bytes] | None = None  # unit files the library has but the disk not yet (tree.py)
    # the one unit candidate this backend was built with (`porter optimize`): named in the evidence, so
    # the candidate's step may carry this backend-wide evidence and an integrity check can tell it is the
    # backend with that candidate, not evidence moved from elsewhere
    candidate: dict | None = None


def run(candidate, ctx) -> GateResult:
    """The driver's shape: the candidate is the whole backend (unit e2e:prefill), ctx.library the library
    the build gate linked from the workspace's unit files; the caller records the evidence.  A candidate
    of one unit (`porter optimize`) is the backend with that unit's new file: its evidence names the tree
    it will make, and it is judged against the committed backend's e2e record too."""
    opts = E2EOptions(store=False)
    if candidate.unit != E2E_UNIT:
        from porter.gates.e2e.state import e2e_records_from_ledger

        opts.candidate = candidate_facts(candidate, ctx)
        opts.replacing = {opts.candidate["path"]: candidate.source.encode()}
        opts.committed = e2e_records_from_ledger(ctx.workspace, ctx.target.name, ctx.history.mine)
    try:  # the engine loads the whole backend, not the one unit's library parity judged
        library = ctx.whole_backend() if ctx.whole_backend is not None else ctx.library
    except PorterError as exc:
        return GateResult(GATE, False, f"e2e failed: {exc}"[:400], check="build")
    return run_e2e(ctx.target, ctx.workspace, library or Path("/nonexistent"), options=opts)


def candidate_facts(candidate, ctx) -> dict:
    """What e2e evidence says of the one unit candidate its backend was built with (`with_candidate`):
    status accepts the evidence in that candidate's step only when unit and sha256 are the step's."""
    rel = Path(ctx.target.unit_path(candidate.unit)).resolve().relative_to(Path(ctx.workspace).resolve())
    return {"unit": candidate.unit, "path": rel.as_posix(), "candidate_sha256": candidate.sha256}


def setup_mismatch(calibrated: dict, now: dict) -> str | None:
    for key in sorted(set(calibrated) | set(now)):
        if key in ("device", "mode"):  # facts about the calibration run, not about what the rule holds for
            continue
        if calibrated.get(key) != now.get(key):
            return f"the rule was calibrated for another {key}"
    return None


def run_e2e(target, workspace_root: Path, library_path: Path, *, options: E2EOptions | None = None) -> GateResult:
    opts = options or E2EOptions()
    if opts.scratch is None:
        # a scratch of porter's own holds GBs (ds4: the 11.5 GB fixture and several builds): gone when the
        # gate is, or every nightly run would leave one behind
        with tempfile.TemporaryDirectory(prefix=f"porter-e2e-{target.name}-", ignore_cleanup_errors=True) as tmp:
            return run_e2e(target, workspace_root, library_path,
                           options=dataclasses.replace(opts, scratch=Path(tmp)))
    ws = Path(workspace_root)
    spec = target.spec.e2e
    if spec is None:
        return GateResult(GATE, False, f"e2e skipped: target {target.name} declares no [e2e]", skipped=True)
    lib = Path(library_path)
    if not lib.is_file():
        return GateResult(GATE, False, f"e2e skipped: no backend library at {lib}", skipped=True)
    cal_path = target.dir / spec.calibration
    try:
        rule, cal_setup, cal_sha = cal_mod.load_rule(cal_path)
        driver = load_driver(target)
        sandbox.require()  # the engine runs the backend's host code: never outside the sandbox unasked
    except (PorterError, sandbox.SandboxUnavailable) as exc:
        return GateResult(GATE, False, f"e2e skipped: {exc}", skipped=True)

    dirs = tree.backend_dirs(target)
    tree_hash = tree.tree_hash_worktree(ws, dirs, opts.replacing)
    head = tree.head_commit(ws)
    head_tree = tree.tree_hash_at(ws, dirs, head) if head else None
    lib_sha = sha256_file(lib)

    scratch = Path(opts.scratch)
    t0 = time.monotonic()
    try:
        ref, cands, setup = driver.prefill_pair(target, scratch, lib, opts.model)
    except ReferenceFailure as exc:
        return GateResult(GATE, False, f"e2e skipped: {exc}"[:400], skipped=True)
    except PorterError as exc:
        # A candidate that cannot build or run its prefill fails: a crash is a verdict.
        ev = _evidence(target, False, lib, lib_sha, tree_hash, head, head_tree, cal_path, cal_sha, {}, None, None,
                       {}, str(exc), with_candidate=opts.candidate)
        metrics = {"ok": False}
        if opts.store:
            from porter.records.evidence import store_evidence

            metrics["evidence_sha256"] = store_evidence(ws, ev)
        return GateResult(GATE, False, f"e2e failed: {exc}"[:400], metrics=metrics, evidence=ev)
    mismatch = setup_mismatch(cal_setup, setup)
    if mismatch:
        return GateResult(GATE, False, f"e2e skipped: {mismatch} ({cal_path.name}); recalibrate", skipped=True)
    comparisons = [compare(ref, c) for c in cands]
    cmp = worst(comparisons)
    verdict = decide(cmp, rule)
    runs = [unchanged.run_figures(c) for c in comparisons]
    against = None
    if verdict.ok and opts.committed is not None and not rule.tokens_exact:
        verdict, against = _against_committed(verdict, runs, opts.committed, head_tree, setup, cal_sha)
    walls = {"reference_s": ref.wall_s, "candidate_s": cands[0].wall_s, "runs": len(cands),
             "total_s": round(time.monotonic() - t0, 3)}
    ev = _evidence(target, verdict.ok, lib, lib_sha, tree_hash, head, head_tree, cal_path, cal_sha, setup, cmp,
                   verdict, walls, None, run_figures=runs, against_committed=against, with_candidate=opts.candidate)
    metrics = {"ok": verdict.ok, "worst_ratio": verdict.worst_ratio if np.isfinite(verdict.worst_ratio) else None,
               "stage": verdict.stage, "token": verdict.token, **walls}
    if opts.store:
        from porter.records.evidence import store_evidence

        metrics["evidence_sha256"] = store_evidence(ws, ev)
    diag = _diagnostics(cmp, rule)
    return GateResult(GATE, verdict.ok, verdict.reason[:400], diag, metrics, ev)


def _against_committed(verdict, runs, records, head_tree, setup, cal_sha):
    """(the verdict, what the evidence says of the comparison) once the committed backend's e2e record at
    HEAD is the baseline; a baseline that cannot be had is said in the summary, never assumed."""
    base, why = unchanged.committed_baseline(records, head_tree, setup, cal_sha)
    if base is None:
        verdict.reason += f"; against the committed backend: not judged ({why})"
        return verdict, {"judged": False, "why": why}
    ok, line, where = unchanged.no_worse(runs, base)
    facts = {"judged": True, "ok": ok, "line": line, "committed_commit": base.commit, "committed_runs": base.runs,
             "committed_worst": {k: unchanged.json_number(v) for k, v in base.worst.items()},
             "committed_spread": base.spread}
    if not ok:
        return Verdict(False, line, where, None, verdict.worst_ratio), facts
    verdict.reason += f"; {line}"
    return verdict, facts


def _evidence(target, ok, lib, lib_sha, tree_hash, head, head_tree, cal_path, cal_sha, setup, cmp, verdict, walls,
              error, **more) -> dict:
    return E2EEvidence.record(gate_facts(
        target, E2E_UNIT, GATE, lib_sha, toolchain.host_facts(), ok=bool(ok), library={"path": str(lib), "sha256": lib_sha},
        tree_hash=tree_hash, commit=head, tree_matches_head=tree_hash == head_tree,
        backend_dirs=tree.backend_dirs(target), driver=target.spec.e2e.driver, setup=setup,
        calibration={"file": str(cal_path.relative_to(target.workspace)) if target.workspace in cal_path.parents
                     else str(cal_path), "sha256": cal_sha},
        verdict=verdict.to_json() if verdict else None, comparison=cmp.to_json() if cmp else None,
        wall_s=walls, error=error, sandbox=sandbox.label(), **more))


def _diagnostics(cmp, rule) -> str:
    lines = [f"{'stage':<14} {'max NMSE':>10} {'ceiling':>10}  worst token"]
    for s, name in enumerate(cmp.stage_names):
        row = cmp.stage_nmse[s]
        t = int(np.argmax(row))
        lines.append(f"{name:<14} {row[t]:>10.2e} {rule.stage_tol[s]:>10.2e}  {t}")
    lines.append(f"{'logits':<14} {cmp.logits_nmse:>10.2e} {rule.logits_tol:>10.2e}")
    return "\n".join(lines)
