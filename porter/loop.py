"""`porter run`: prompt -> answer -> extract -> gates -> one commit per passing step.

Durable writes, in the order they happen, and what a SIGKILL after each leaves
(the next run repairs it before doing anything else, see `reconcile`):

  per attempt
   1. runs/<run>/<unit>/attempt-N.{prompt,response}.md   (ignored by git; nothing to repair)
   2. ledger "attempt"        -> kill: an attempt with no verdict; reconcile appends
                                 "reconcile" action=abandon-attempt, and the unit is tried again
                                 (the scripted provider replays the same answer).
   3. per gate: evidence file (ledger/evidence/<sha>.json), then ledger "gate"
                              -> kill: an orphan evidence file (content-addressed, harmless) or
                                 gate records with no verdict: same as 2.
  on a failure
   4. runs/diagnostics/<sha>.txt, then ledger "failure"
                              -> kill: the attempt is concluded; the next run continues with the
                                 next attempt.  (Kill before the record: same as 2.)
   5. after the last failed attempt: ledger "exhausted".
  on success
   4. the unit file, written to a temp file, fsynced, renamed over targets/<t>/ported/<unit>.cu
                              -> kill: a unit file holding the candidate of a verdict-less attempt:
                                 reconcile restores the committed version and abandons the attempt.
   5. ledger "step" (candidate sha256, evidence sha256s)
                              -> kill: a step with no commit whose file on disk is the candidate:
                                 reconcile makes that commit now (a step whose file does not match is
                                 abandoned with a "reconcile" record).
   6. git commit of the unit file + ledger/ (ledger.jsonl and the evidence) with the step's trailers
                              -> kill after: nothing to do.  A step is committed iff a commit
                                 reachable from HEAD carries `Porter-Step: <its record hash>`,
                                 so no step is ever committed twice.
  end of run: the ledger records since the last step commit are committed as "porter: ledger of run <id>".

PORTER_TEST_KILL_AT=<point>[:<n>] makes the process SIGKILL itself right after
the n-th (default first) durable write named <point> (see KILL_POINTS); the
crash tests use it to check every row of the table above.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from porter import gitops
from porter.calibration.baseline import take_baselines
from porter.digest import sha256_bytes
from porter.durable import write_atomic
from porter.errors import PorterError
from porter.evidence import store_evidence
from porter.extract import ExtractionError, extract_unit_source
from porter.gates import parity
from porter.gates.build import nvcc_path
from porter.gates.driver import E2E_UNIT, Candidate, GateContext, passed, run_gates, verdict_word
from porter.gates.e2e.wiring import head_backend_tree, run_e2e_if_due
from porter.gates.parity.spec import load_spec
from porter.gates.result import GateResult
from porter.history import GateRecord, History, Step, typed
from porter.ledger import Ledger, load_key
from porter.lock import RunLock
from porter.signing import signer_for
from porter.plan import ranked_units
from porter.prompt import build_prompt
from porter.providers import ProviderError, get_provider
from porter.providers.budget import usage_record
from porter.status import derive
from porter.target import load_target

KILL_POINTS = (
    "after-attempt", "after-evidence", "after-gate", "after-failure", "after-exhausted",
    "after-unit-file", "after-step", "after-commit", "after-reconcile",
)
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Test hook: SIGKILL this process at the named point when PORTER_TEST_KILL_AT says so."""
    want = os.environ.get("PORTER_TEST_KILL_AT")
    if not want:
        return
    point, _, nth = want.partition(":")
    if point != name:
        return
    _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if _kill_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def parse_duration(text: str | None) -> float | None:
    """'30m', '2h', '90s', '1h30m', '45' (seconds) -> seconds."""
    if text is None:
        return None
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", s)
    if not parts or "".join(f"{a}{b}" for a, b in parts) != s.replace(" ", ""):
        raise PorterError(f"--time-budget {text!r}: use e.g. 30m, 2h, 90s or 1h30m")
    return sum(float(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)


# ---------------------------------------------------------------- output


class Reporter:
    """Progress on the terminal (rich) and the same lines in runs/<run>/run.log."""

    def __init__(self, log_path: Path | None = None, quiet: bool = False):
        self.console = Console(highlight=False, soft_wrap=True)
        self.bar = None  # the run's progress bar, on a terminal only
        self.log_path = log_path
        self.quiet = quiet
        self._log = open(log_path, "a", buffering=1) if log_path else None
        self._lock = threading.Lock()  # --jobs N: lines from several units, never interleaved

    def line(self, text: str, style: str | None = None) -> None:
        with self._lock:
            self._line(text, style)

    def _line(self, text: str, style: str | None) -> None:
        if not self.quiet:
            self.console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
        if self._log:
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
            self._log.write(f"{stamp} {text}\n")

    def progress(self, total: int, what: str) -> "UnitBar":
        """A progress bar under the lines on a terminal; nothing extra in pipes and logs (the lines say it)."""
        self.bar = UnitBar(self.console if (self.console.is_terminal and not self.quiet) else None, total, what)
        return self.bar

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self._log:
            self._log.close()
            self._log = None


class UnitBar:
    """rich's Progress over the run's units: the current unit as its label; inert without a console."""

    def __init__(self, console: Console | None, total: int, what: str):
        self._p = None
        if console is None or total <= 0:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=console, transient=True)
        self._task = self._p.add_task(what, total=total)
        self._what = what
        self._p.start()

    def working_on(self, label: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=f"{self._what}: {label}")

    def advance(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


# ---------------------------------------------------------------- options


@dataclass
class RunOptions:
    """What `porter run` was asked to do (the CLI builds it; tests may too)."""

    workspace: Path
    target: str | None = None
    source: str | None = None
    units: list[str] = field(default_factory=list)  # explicit --unit: only these, exhausted ones retried
    max_attempts: int = 3
    max_units: int | None = None
    time_budget: str | None = None
    quiet: bool = False
    provider: dict = field(default_factory=dict)  # provider, model, base_url, prices, budgets
    jobs: int = 1  # units in flight at once (provider calls in parallel, gates through the worker pool)


# ---------------------------------------------------------------- reconcile


def commit_step(workspace: Path, step: Step) -> str:
    msg = gitops.step_message(step.target, step.unit, step.state, int(step.attempt), step.candidate_sha256,
                              step.hash, list(step.evidence))
    return gitops.commit_paths(workspace, [step.unit_file, "ledger"], msg)


def reconcile(workspace: Path, target, ledger, out: Reporter) -> list[str]:
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


# ---------------------------------------------------------------- one attempt


@dataclass
class AttemptOutcome:
    ok: bool
    state: str | None = None  # built | verified
    gate: str | None = None  # the gate that refused it
    summary: str = ""
    commit: str | None = None
    verdicts: list[str] = field(default_factory=list)


class SerialLedger:
    """The run's ledger with appends under the run's records lock (threads of --jobs N)."""

    def __init__(self, ledger, lock):
        self._ledger, self._lock = ledger, lock

    def append(self, kind: str, **fields) -> dict:
        with self._lock:
            return self._ledger.append(kind, **fields)

    def __getattr__(self, name):
        return getattr(self._ledger, name)


class Run:
    def __init__(self, workspace: Path, target, provider, ledger, out: Reporter, run_id: str, run_dir: Path):
        self.ws = workspace
        self.target = target
        self.provider = provider
        self.ledger = ledger
        self.out = out
        self.run_id = run_id
        self.run_dir = run_dir
        self.parity_ok, self.parity_reason = parity.available()
        self.commits: list[str] = []
        # --jobs N: ledger appends, history reads, unit-file writes and commits happen one at a time,
        # so every record and commit is the same as some one-unit-at-a-time run would have made
        self.records = threading.RLock()
        self.ledger = SerialLedger(ledger, self.records)
        # --jobs N: first answers asked for while the unit still waits for the units it depends on
        # (the model thinks while the runtime units are gated); (unit, attempt) -> (request, future)
        self.prefetched: dict[tuple[str, int], tuple] = {}

    def history(self) -> History:
        with self.records:
            return History.read(self.ws, self.target.name, self.ledger.key)

    def _save(self, unit: str, name: str, text: str) -> str:
        d = self.run_dir / unit
        d.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        (d / name).write_bytes(data)
        return sha256_bytes(data)

    def _diagnostics(self, text: str) -> str:
        data = text.encode()
        sha = sha256_bytes(data)
        p = self.ws / "runs" / "diagnostics" / f"{sha}.txt"
        if not p.is_file():
            p.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(p, data)
        return sha

    def _record_gate(self, unit: str, attempt: int, res: GateResult) -> str:
        ev = {"target": self.target.name, "unit": unit, "gate": res.gate, "ok": res.ok, "candidate_sha256": None,
              "toolchain": {}, "skipped": res.skipped, "summary": res.summary, **res.evidence,
              "run": self.run_id, "attempt": attempt}
        sha = store_evidence(self.ws, ev)
        kill_point("after-evidence")
        self.ledger.append("gate", target=self.target.name, unit=unit, attempt=attempt, gate=res.gate, ok=res.ok,
                           skipped=res.skipped, summary=res.summary, evidence=sha)
        kill_point("after-gate")
        return sha

    def prefetch(self, unit: str, pool) -> bool:
        """Ask for `unit`'s next answer now, on `pool`, for its attempt to use (see _complete).  The usage
        is recorded when the answer arrives: it is spent either way."""
        uh = self.history().unit(unit)
        attempt = uh.next_attempt
        if (unit, attempt) in self.prefetched:
            return False
        failures = [f.raw for f in uh.failures_since_step]
        req = build_prompt(self.target, unit, attempt, failures)
        req.meta.setdefault("builder", "porter.prompt")
        req.meta["asked_early"] = True

        def fetch():
            completion = self.provider.complete(req)
            self._usage(unit, completion)
            return completion

        self.prefetched[(unit, attempt)] = (req, pool.submit(fetch), failures)
        return True

    def _complete(self, unit: str, attempt: int, failures: list[dict], req):
        """(the provider's answer, the request it answers, was it asked early).  An answer asked for
        early is used when it was asked with the same failures: its prompt may lack style examples
        of units committed since (the first units of any port have none), and the attempt records
        the prompt that was really sent."""
        early = self.prefetched.pop((unit, attempt), None)
        if early is not None and early[2] == failures:
            return early[1].result(), early[0], True  # a ProviderError is raised here, as from complete()
        return self.provider.complete(req), req, False

    def attempt(self, unit: str, attempt: int, failures: list[dict]) -> AttemptOutcome:
        """Ask the provider once, extract the candidate, run the gates, and land a step if they pass."""
        target = self.target
        req = build_prompt(target, unit, attempt, failures)
        req.meta.setdefault("builder", "porter.prompt")
        completion, req, early = self._complete(unit, attempt, failures, req)
        prompt_sha = self._save(unit, f"attempt-{attempt}.prompt.md",
                                f"<!-- system -->\n{req.system}\n\n<!-- prompt -->\n{req.prompt}\n")
        response_sha = self._save(unit, f"attempt-{attempt}.response.md", completion.text)
        if not early:
            self._usage(unit, completion)

        candidate = None
        try:
            source = extract_unit_source(completion.text, unit, target)
            candidate = Candidate.of(unit, source)
            self._save(unit, f"attempt-{attempt}.candidate.cu", source)
            extract = GateResult("extract", True, f"one code block defines {unit} ({len(source.splitlines())} lines)")
        except ExtractionError as exc:
            extract = GateResult("extract", False, str(exc), diagnostics=str(exc), check="extract")
        extract.evidence = {"candidate_sha256": candidate.sha256 if candidate else None,
                            "response_sha256": response_sha, "toolchain": {"extractor": "porter.extract"}}
        self.ledger.append(
            "attempt", target=target.name, unit=unit, attempt=attempt, run=self.run_id,
            provider=completion.provider, model=completion.model, prompt_sha256=prompt_sha,
            response_sha256=response_sha, candidate_sha256=candidate.sha256 if candidate else None,
            usage=dict(completion.usage or {}), prompt_builder=req.meta["builder"],
        )
        kill_point("after-attempt")
        return self._gates_and_step(unit, attempt, candidate, extract)

    def reverify(self, step: Step) -> AttemptOutcome:
        """Run parity (and perf) on a unit that was committed as 'built' before parity could run here.

        The candidate is the unit file as committed; the gate records carry the step's attempt
        number.  A pass lands a 'verified' step (a commit of the ledger only); a refusal is a
        failure record of that attempt, so the next attempt starts from its diagnostics.
        """
        candidate = Candidate.of(step.unit, self.target.unit_path(step.unit).read_text())
        return self._gates_and_step(step.unit, int(step.attempt or 0), candidate, None,
                                    gates=("build", "parity", "perf"))

    def _gates_and_step(self, unit: str, attempt: int, candidate: Candidate | None, extract: GateResult | None,
                        gates=("static", "build", "parity", "perf")) -> AttemptOutcome:
        target = self.target
        ctx = GateContext(target, self.ws)
        outcome = AttemptOutcome(ok=False)
        evidence: list[str] = []

        def record(res: GateResult) -> None:
            evidence.append(self._record_gate(unit, attempt, res))
            outcome.verdicts.append(verdict_word(res))

        results = [extract] if extract is not None else []
        if extract is not None:
            record(extract)
        if candidate is not None:
            results += run_gates(candidate, ctx, gates, on_result=record)
        refused = next((r for r in results if not r.ok and not r.skipped), None)
        if refused is not None:
            dsha = self._diagnostics(refused.diagnostics or refused.summary)
            self.ledger.append("failure", target=target.name, unit=unit, attempt=attempt, gate=refused.gate,
                               summary=refused.summary, diagnostics=dsha)
            kill_point("after-failure")
            outcome.gate, outcome.summary = refused.gate, refused.summary
            return outcome

        # Every gate that ran passed: write the unit file, record the step, commit them together.
        with self.records:
            return self._land_step(unit, attempt, candidate, ctx, evidence, results, outcome)

    def _land_step(self, unit, attempt, candidate, ctx, evidence, results, outcome) -> AttemptOutcome:
        target = self.target
        state = "verified" if passed(ctx.results.get("parity")) else "built"
        path = target.unit_path(unit)
        if not path.is_file() or sha256_bytes(path.read_bytes()) != candidate.sha256:
            write_atomic(path, candidate.source.encode())
        kill_point("after-unit-file")
        # the step record and its commit under one lock: a commit of another unit in between would
        # commit this step's ledger line without its trailer, which status rightly calls a dropped commit
        # (measured with --jobs 8 on ds4 after a failed commit)
        with self.records:
            raw = self.ledger.append(
                "step", target=target.name, unit=unit, attempt=attempt, state=state,
                candidate_sha256=candidate.sha256, unit_file=str(path.relative_to(self.ws)), evidence=evidence,
                run=self.run_id,
            )
            kill_point("after-step")
            sha = commit_step(self.ws, typed(0, raw))
            kill_point("after-commit")
        self.commits.append(sha)
        outcome.ok, outcome.state, outcome.commit = True, state, sha
        outcome.summary = next((r.summary for r in reversed(results) if not r.skipped), results[-1].summary)
        return outcome

    def can_verify(self, unit: str) -> bool:
        """Parity can run here and the unit has a spec."""
        try:
            return self.parity_ok and load_spec(self.target, unit) is not None
        except PorterError:
            return False

    def _usage(self, unit: str, completion) -> None:
        """A "usage" record for a provider call (a Completion, or a ProviderError carrying .usage)."""
        if getattr(completion, "provider", None) == "scripted" or getattr(self.provider, "name", None) == "scripted":
            return  # replayed answers cost nothing; the attempt record names the answer file
        self.ledger.append("usage", **usage_record(completion, target=self.target.name, unit=unit))


# ---------------------------------------------------------------- the run


def ordered_units(target, out: Reporter) -> list[str]:
    runtime = [u for u in target.units if u in target.runtime_units]
    fallback = runtime + [u for u in target.units if u not in runtime]
    try:
        ranked = [r.unit for r in ranked_units(target)]
    except PorterError as exc:
        out.line(f"order: header order, runtime units first (ranking failed: {exc})", "yellow")
        return fallback
    order = [u for u in ranked if u in target.units]
    return order + [u for u in fallback if u not in order]


def select_units(target, history: History, order: list[str], explicit: bool, r: Run):
    """(to port, to verify first, skipped with why): what this run will do, from the history alone."""
    todo, reverify, skipped = [], set(), []
    for u in order:
        uh = history.unit(u)
        path = target.unit_path(u)
        step = uh.step_for(sha256_bytes(path.read_bytes()) if path.is_file() else None)
        state = step.state if step else None
        if state == "built" and r.can_verify(u):
            if uh.refutation is None:  # committed before parity could run here: verify the committed file first
                reverify.add(u)
                todo.append(u)
                continue
            state = None  # its committed candidate failed parity or perf: port it again
        if state:
            skipped.append(f"{u} ({state})")
        elif not explicit and uh.exhausted:
            skipped.append(f"{u} (exhausted earlier; retry with --unit {u})")
        else:
            todo.append(u)
    return todo, reverify, skipped


def port_unit(unit: str, r: Run, opts: RunOptions, reverify: bool, out_of_time,
              label: str = "") -> tuple[str | None, str | None]:
    """Attempts at one unit until a step lands, its attempts run out, or the run must stop.
    Returns (how it ended: verified/built/exhausted/budget or None, why the run stops or None).
    label: put before each line (the unit's name when several are in flight)."""
    target, ledger, out = r.target, r.ledger, r.out
    if reverify:
        step = r.history().unit(unit).last_step
        o = r.reverify(step)
        verdicts = " · ".join(o.verdicts)
        if o.ok:
            out.line(f"  {label}committed attempt {step.attempt}: {verdicts} -> {o.state}, committed {o.commit[:10]}", "green")
            return o.state, None
        out.line(f"  {label}committed attempt {step.attempt}: {verdicts} -> {o.gate}: {o.summary}", "red")
    for _ in range(opts.max_attempts):
        if out_of_time():
            return None, f"time budget {opts.time_budget} spent"
        uh = r.history().unit(unit)
        try:
            o = r.attempt(unit, uh.next_attempt, [f.raw for f in uh.failures_since_step])
        except ProviderError as exc:
            if getattr(exc, "usage", None):
                r._usage(unit, exc)
            if getattr(exc, "scope", None) == "unit":
                out.line(f"  {label or unit + ': '}skipped, {exc}", "yellow")
                return "budget", None
            return "provider", f"provider: {exc}"
        verdicts = " · ".join(o.verdicts)
        if o.ok:
            out.line(f"  {label}attempt {uh.next_attempt}: {verdicts} -> {o.state}, committed {o.commit[:10]}", "green")
            return o.state, None
        out.line(f"  {label}attempt {uh.next_attempt}: {verdicts} -> {o.gate}: {o.summary}", "red")
    ledger.append("exhausted", target=target.name, unit=unit, attempts=opts.max_attempts, run=r.run_id)
    kill_point("after-exhausted")
    out.line(f"  {label or unit + ': '}exhausted after {opts.max_attempts} attempt(s) in this run", "red")
    return "exhausted", None


def unit_dependencies(target, todo: list[str], out: Reporter) -> dict[str, set[str]]:
    """unit -> the units of `todo` it must wait for: every runtime unit before any op, and the
    API functions its host implementation calls (porter.scan) before it."""
    runtime = {u for u in todo if u in target.runtime_units}
    deps = {u: (set() if u in runtime else set(runtime)) for u in todo}
    try:
        from porter.scan import scan

        api = scan(target).host.api
    except Exception as exc:  # noqa: BLE001 - the runtime-first order still holds without the scan
        out.line(f"order: unit call graph unavailable ({type(exc).__name__}: {exc}); runtime units first", "yellow")
        return deps
    for u in todo:
        ad = api.get(u)
        for c in (ad.api_calls if ad else []):
            if c in deps and c != u and u not in _reachable(deps, c):  # never a cycle
                deps[u].add(c)
    return deps


def _reachable(deps: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for d in deps.get(stack.pop(), ()):
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def verify_deferred(r: Run, opts: RunOptions, results: dict[str, str], out_of_time) -> str | None:
    """Parity again on the units this run committed as 'built' although parity runs here.

    A runtime unit's scenario drives the other runtime units it calls, and a candidate may call other
    API functions; while one of them is still a placeholder parity is skipped and the unit lands as
    'built' (measured on ds4 with --jobs 8: 20 of 24 runtime units, their scenarios calling each other;
    and the shared gate/up refused 3 times while the swiglu it calls was a placeholder).  Once the pass is over
    they are ported, so each such unit's committed file is verified now, as a later run would."""
    def ready(u: str) -> bool:
        return not parity.waiting_on(r.target, load_spec(r.target, u),
                                     Candidate.of(u, r.target.unit_path(u).read_text(errors="replace")))

    again = [u for u, how in results.items() if how == "built" and r.can_verify(u) and ready(u)]
    if not again:
        return None
    r.out.line(f"{len(again)} unit(s) built while the units their checks call were placeholders: "
               "verifying their committed files now", "bold cyan")
    for unit in again:
        if out_of_time():
            return f"time budget {opts.time_budget} spent"
        how, why = port_unit(unit, r, opts, True, out_of_time, f"{unit}: ")
        if how:
            results[unit] = how
        if why:
            return why
    return None


@contextmanager
def _not_awaited(executor: ThreadPoolExecutor):
    """The executor, shut down on the way out without waiting: answers asked early for units that
    never started (a stop, an error) are not worth a minute of the run."""
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def port_concurrently(todo: list[str], r: Run, opts: RunOptions, reverify: set, out_of_time,
                      results: dict[str, str]) -> str | None:
    """--jobs N: up to N units in flight, each started once every unit it depends on has ended
    (however it ended).  A reason to stop lets the units in flight finish and starts no more."""
    deps = unit_dependencies(r.target, todo, r.out)
    pending = list(todo)
    ended: set[str] = set()
    stop_reason: str | None = None
    started = 0
    asked_early: set[str] = set()
    with _not_awaited(ThreadPoolExecutor(max_workers=opts.jobs, thread_name_prefix="porter-ask")) as ask, \
            ThreadPoolExecutor(max_workers=opts.jobs, thread_name_prefix="porter-unit") as pool:
        flying: dict = {}
        while pending or flying:
            while not stop_reason and len(flying) < opts.jobs:
                ready = next((u for u in pending if deps[u] <= ended), None)
                if ready is None:
                    break
                if opts.max_units is not None and started >= opts.max_units:
                    stop_reason = f"--max-units {opts.max_units} reached"
                    break
                pending.remove(ready)
                started += 1
                kind = "runtime" if ready in r.target.runtime_units else "op"
                r.out.line(f"[{started}/{len(todo)}] {ready} ({kind}) started", "bold cyan")
                flying[pool.submit(port_unit, ready, r, opts, ready in reverify, out_of_time, f"{ready}: ")] = ready
            # free slots while units wait for their dependencies: their first answers are asked for now
            # (a model thinks for a minute; measured at --jobs 8 on minimoe, waiting for the runtime units
            # held the run to 5.99x --jobs 1).  Never more answers in the air than --jobs, never beyond
            # --max-units, never once stopping, never for a unit that starts by re-checking a committed file.
            waiting_asked = sum(1 for u in asked_early if u in pending)  # asked, not started yet
            room = opts.jobs - len(flying) - waiting_asked
            limit = None if opts.max_units is None else opts.max_units - started - waiting_asked
            for u in pending:
                if room <= 0 or stop_reason or out_of_time() or (limit is not None and limit <= 0):
                    break
                if u in asked_early or u in reverify or deps[u] <= ended:
                    continue
                if r.prefetch(u, ask):
                    asked_early.add(u)
                    room -= 1
                    if limit is not None:
                        limit -= 1
            if not flying:
                break  # stopped, or nothing left that can start
            done, _ = wait(list(flying), return_when=FIRST_COMPLETED)
            for fut in done:
                unit = flying.pop(fut)
                ended.add(unit)
                how, why = fut.result()
                if how:
                    results[unit] = how
                if why and not stop_reason:
                    stop_reason = why
    return stop_reason


def check_options(target, opts: RunOptions) -> float | None:
    """One-line errors for bad options, before anything is written; returns the time budget in seconds."""
    for u in opts.units:
        target.api_function(u)  # unknown unit -> one-line error
        if u not in target.units:
            raise PorterError(f"{u} is listed in [units].skip of {target.name}'s target.toml: it is not ported")
    if opts.max_attempts < 1:
        raise PorterError("--max-attempts must be at least 1")
    if opts.jobs < 1:
        raise PorterError("--jobs must be at least 1")
    budget_s = parse_duration(opts.time_budget)
    nvcc_path()  # no nvcc, no run
    if not target.conventions_header.is_file():
        raise PorterError(f"target {target.name} has no CUDA conventions header "
                          f"({target.conventions_header.relative_to(opts.workspace)}): units cannot build until it is written")
    return budget_s


def refuse_if_tampered(ws: Path, target, key) -> None:
    """A run appends to the ledger and commits it: over a tampered or rolled-back workspace that
    would bury the evidence of tampering, so it refuses (exit 3) and `porter repair` is the way on."""
    from porter.status import derive

    report = derive(ws, key=key, use_static=False, target=target, rank=False)
    if not report.tampered:
        return
    led = report.ledger
    first = (led["problems"] + report.problems
             + [f"{u.unit}: {u.reason}" for u in report.units if u.state == "tampered"])[0]
    what = "rolled back" if led.get("rolled_back") else "tampered"
    raise PorterError(f"workspace {what}, not starting: {first}; see `porter status`, and `porter repair --reason "
                      f"TEXT` to accept the loss and go on", exit_code=3)


def run(opts: RunOptions) -> int:
    ws = opts.workspace
    target = load_target(ws, opts.target, opts.source)
    opts.units = list(dict.fromkeys(opts.units))  # repeated --unit: once
    budget_s = check_options(target, opts)
    key = load_key(ws)
    provider = get_provider(opts.provider.get("provider"), target, opts.provider)
    if opts.provider.get("answer_delay_s"):
        from porter.providers.delayed import DelayedProvider

        provider = DelayedProvider(provider, opts.provider["answer_delay_s"])
    signer = signer_for(ws)  # a signed workspace and no key, or another key: one line, exit 3

    lock = RunLock(ws)
    if not lock.acquire():
        pid = lock.holder()
        print(f"porter: another porter run is active (pid {pid if pid else '?'}); nothing to do")
        return 0
    try:
        refuse_if_tampered(ws, target, key)
    except BaseException:
        lock.release()
        raise
    started = time.monotonic()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    run_dir = ws / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Reporter(run_dir / "run.log", quiet=opts.quiet)
    try:
        ledger = Ledger(ws, key, signer)
        if ledger.repair_torn_tail():
            out.line("ledger: a torn last line (interrupted write) was moved aside and recorded", "yellow")
        for line in reconcile(ws, target, ledger, out):
            out.line(f"reconcile: {line}", "yellow")
        if hasattr(getattr(provider, "budget", None), "seed"):
            provider.budget.seed(ledger.records())

        r = Run(ws, target, provider, ledger, out, run_id, run_dir)
        order = opts.units or ordered_units(target, out)
        todo, reverify, skipped = select_units(target, r.history(), order, bool(opts.units), r)
        for line in skipped if opts.units else []:
            out.line(f"{line}: nothing to do", "dim")
        out.line(f"porter run {run_id}: target {target.name}, provider {provider.describe()}, "
                 f"{len(todo)} unit(s) to port, {len(skipped)} already done or skipped", "bold")
        if not r.parity_ok:
            out.line(f"parity: not available here ({r.parity_reason}); passing units are committed as 'built'", "yellow")
        elif todo:
            take_baselines(target, ws, r.history(), todo, r.ledger, line=out.line)
        results: dict[str, str] = {}
        stop_reason = None
        out_of_time = lambda: budget_s is not None and time.monotonic() - started > budget_s  # noqa: E731
        if opts.jobs > 1:
            stop_reason = port_concurrently(todo, r, opts, reverify, out_of_time, results)
            stop_reason = stop_reason or verify_deferred(r, opts, results, out_of_time)
            return finish(ws, target, r, results, stop_reason, run_dir)
        bar = out.progress(min(len(todo), opts.max_units if opts.max_units is not None else len(todo)), "porting")
        for i, unit in enumerate(todo):
            if opts.max_units is not None and i >= opts.max_units:
                stop_reason = f"--max-units {opts.max_units} reached"
                break
            out.line(f"[{i + 1}/{len(todo)}] {unit} ({'runtime' if unit in target.runtime_units else 'op'})", "bold cyan")
            bar.working_on(unit)
            ended, stop_reason = port_unit(unit, r, opts, unit in reverify, out_of_time)
            bar.advance()
            if ended:
                results[unit] = ended
            if stop_reason:
                break
        bar.stop()
        stop_reason = stop_reason or verify_deferred(r, opts, results, out_of_time)
        return finish(ws, target, r, results, stop_reason, run_dir)
    finally:
        out.close()
        lock.release()


def end_to_end(ws: Path, target, r: Run) -> None:
    """The e2e gate on the whole backend once every prefill-tier unit is verified, and again after any
    of them changed (a new backend tree at HEAD); its record is what status's prefill line reads."""
    if target.spec.e2e is None or not r.parity_ok:
        return
    report = derive(ws, target=target)
    states = {u.unit: u.state for u in report.units}
    prefill_units = [u.unit for u in report.units if u.tier == "prefill"]
    e2e_records = [g.raw for g in r.history().mine if isinstance(g, GateRecord) and g.gate == "e2e"]

    def build_and_run() -> GateResult:
        unit = (prefill_units or target.units)[0]  # any unit's current file: the build links them all
        ctx = GateContext(target, ws)
        built = run_gates(Candidate.of(unit, target.unit_path(unit).read_text()), ctx, gates=("build",))[-1]
        if not built.ok:
            return GateResult("e2e", False, f"e2e: the backend does not build: {built.summary}", check="build")
        return run_gates(Candidate(E2E_UNIT, "", head_backend_tree(ws, target) or ""), ctx, gates=("e2e",))[-1]

    def record(res: GateResult) -> None:
        r._record_gate(E2E_UNIT, 0, res)
        r.out.line(f"e2e: {res.summary}", "green" if res.ok else "red")

    run_e2e_if_due(target, ws, states, prefill_units, e2e_records, run=build_and_run, record=record)


def finish(ws: Path, target, r: Run, results: dict[str, str], stop_reason: str | None, run_dir: Path) -> int:
    """Run e2e when it is due, commit the records since the last step commit (failures, exhausted,
    reconcile, e2e); say how the run ended."""
    end_to_end(ws, target, r)
    if gitops.dirty_paths(ws, "ledger"):
        n_fail = sum(1 for v in results.values() if v == "exhausted")
        gitops.commit_paths(ws, ["ledger"], f"porter: ledger of run {r.run_id} ({n_fail} unit(s) exhausted)\n\n"
                                            f"Porter-Run: {r.run_id}\nPorter-Target: {target.name}\n")
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("verified", "built", "exhausted")}
    tail = f"; stopped: {stop_reason}" if stop_reason else ""
    r.out.line(f"run {r.run_id}: {counts['verified']} verified, {counts['built']} built, {counts['exhausted']} exhausted, "
               f"{len(r.commits)} step commit(s){tail}; log: {(run_dir / 'run.log').relative_to(ws)}", "bold")
    failed = counts["exhausted"] > 0 or (stop_reason or "").startswith("provider")
    return 1 if failed else 0
