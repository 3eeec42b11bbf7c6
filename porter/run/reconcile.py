"""Reconcile: make the ledger and git agree after a crash, before a run does anything else
(what each kill leaves and how it is repaired: the table in porter.run's docstring)."""

from __future__ import annotations

from pathlib import Path

from porter.records import gitops
from porter.digest import sha256_bytes
from porter.records.history import History
from porter.run.attempt import commit_step
from porter.run.kill import kill_point


def reconcile(workspace: Path, target, ledger, out) -> list[str]:
    """Make ledger and git agree after a crash; return one line per repair made."""
    gitops.check_index_unlocked(workspace)
    done: list[str] = []
    name = target.name

    # 1. step records whose commit is missing.
    history = History.read(workspace, name, ledger.key)
    for step in history.steps.values():
        if step.hash in history.abandoned_steps or gitops.commits_with_trailer(workspace, "Porter-Step", step.hash):
            continue
        path = workspace / step.unit_file
        on_disk = sha256_bytes(path.read_bytes()) if path.is_file() else None
        if on_disk == step.candidate_sha256:
            ledger.append("reconcile", target=name, unit=step.unit, attempt=step.attempt, action="commit-step",
                          committed_step=step.hash, reason="step recorded but not committed (run interrupted)")
            sha = commit_step(workspace, step)
            done.append(f"committed the interrupted step of {step.unit} (attempt {step.attempt}) as {sha[:10]}")
        else:
            ledger.append("reconcile", target=name, unit=step.unit, attempt=step.attempt, action="abandon-step",
                          step=step.hash, reason=f"unit file is not the step's candidate (file sha256 {on_disk})")
            done.append(f"abandoned the uncommitted step of {step.unit} (attempt {step.attempt}): file changed")
        kill_point("after-reconcile")

    # 2. attempts that never reached a verdict.
    history = History.read(workspace, name, ledger.key)
    candidates_of_open: dict[str, set[str]] = {}
    for a in history.open_attempts():
        ledger.append("reconcile", target=name, unit=a.unit, attempt=a.attempt, action="abandon-attempt",
                      reason="the run ended before this attempt's verdict (crash or kill); it is tried again")
        if a.candidate_sha256:
            candidates_of_open.setdefault(a.unit, set()).add(a.candidate_sha256)
        done.append(f"abandoned attempt {a.attempt} of {a.unit} (no verdict recorded)")
        kill_point("after-reconcile")

    # 3. unit files an interrupted run wrote without recording a step: back to the committed version.
    history = History.read(workspace, name, ledger.key)
    rel_dir = str(target.ported_dir.relative_to(workspace))
    for rel in gitops.dirty_paths(workspace, rel_dir):
        unit = Path(rel).stem
        if unit not in target.units:
            continue
        path = workspace / rel
        sha = sha256_bytes(path.read_bytes()) if path.is_file() else None
        uh = history.unit(unit)
        if uh.step_for(sha) is not None:
            continue
        if any(a.candidate_sha256 == sha for a in uh.attempts) or sha in candidates_of_open.get(unit, set()):
            gitops.restore(workspace, rel)
            ledger.append("reconcile", target=name, unit=unit, action="restore-file", file=rel, file_sha256=sha,
                          reason="unit file written by an interrupted run without a step record; committed version restored")
            done.append(f"restored {rel} (written by an interrupted run, never recorded as a step)")
            kill_point("after-reconcile")
        else:
            out.line(f"note: {rel} has changes porter did not make; left as it is", "yellow")
    return done
