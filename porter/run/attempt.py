"""One attempt at a unit, and landing it; the route of a candidate, one plain step after another:
prompt -> answer (text + provenance) -> typed Candidate (the answer gates: extract) -> attempt record
-> the unit gates on that candidate -> unit file, step record, commit, or a failure record (the
records each leaves: the table in porter.run's docstring)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from porter.records import gitops
from porter.digest import sha256_bytes
from porter.records.durable import write_atomic
from porter.errors import EnvironmentFault, PorterError
from porter.records.evidence import store_evidence
from porter.gates import parity, registry
from porter.gates.driver import (Answer, Candidate, Extraction, GateContext, Provenance, answer_gates,
                                 candidate_gates, extract_candidate, passed, refusal, run_gates, verdict_word)
from porter.spec import load_spec
from porter.gates.result import GateResult
from porter.records.history import Failure, History, Step, typed
from porter.prompt import build_prompt
from porter.providers import ProviderError, send
from porter.providers.budget import usage_record
from porter.run.kill import kill_point


def commit_step(workspace: Path, step: Step, headline: str = "") -> str:
    msg = gitops.step_message(step.target, step.unit, step.state, int(step.attempt), step.candidate_sha256,
                              step.hash, list(step.evidence), headline)
    return gitops.commit_paths(workspace, [step.unit_file, "ledger"], msg)


@dataclass
class AttemptOutcome:
    ok: bool
    state: str | None = None  # built | verified
    gate: str | None = None  # the gate that refused it
    check: str | None = None  # the check of that gate that refused it (GateResult.check)
    summary: str = ""
    commit: str | None = None
    verdicts: list[str] = field(default_factory=list)


@dataclass
class _Trail:
    """What one attempt (or a re-verification of a committed step) has left so far: each gate's result
    and evidence, in order, and whether an attempt record was opened for it."""

    unit: str
    attempt: int
    opened: bool = False  # an attempt record was written: an environment fault abandons it
    results: list[GateResult] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    outcome: AttemptOutcome = field(default_factory=lambda: AttemptOutcome(ok=False))


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
    def __init__(self, workspace: Path, target, provider, ledger, out, run_id: str, run_dir: Path):
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
        failures = uh.failures_since_step
        req = build_prompt(self.target, unit, attempt, failures)
        req.meta["asked_early"] = True

        def fetch():
            completion = send(self.provider, req)
            self._usage(unit, completion)
            return completion

        self.prefetched[(unit, attempt)] = (req, pool.submit(fetch), failures)
        return True

    def _complete(self, unit: str, attempt: int, failures: list[Failure], req):
        """(the provider's answer, the request it answers, was it asked early).  An answer asked for
        early is used when it was asked with the same failures: its prompt may lack style examples
        of units committed since (the first units of any port have none), and the attempt records
        the prompt that was really sent."""
        early = self.prefetched.pop((unit, attempt), None)
        if early is not None and early[2] == failures:
            return early[1].result(), early[0], True  # a ProviderError is raised here, as from complete()
        return send(self.provider, req), req, False

    def attempt(self, unit: str, attempt: int, failures: list[Failure], *, request=build_prompt, gates=None,
                purpose: str | None = None, required: tuple[str, ...] = ()) -> AttemptOutcome:
        """One attempt's route: ask the provider once; the answer becomes a typed candidate (the answer
        gates: extract); the attempt is recorded; the candidate meets the unit gates; a step lands if
        they pass.  An answer refused at extraction is recorded the same way, with no candidate.

        `porter optimize` passes its own request builder (same arguments as build_prompt), its gate list,
        purpose="optimize" (kept in the attempt record) and the gates that must have PASSED for a step to
        land (a speedup no GPU measured is no speedup)."""
        req = request(self.target, unit, attempt, failures)
        completion, req, early = self._complete(unit, attempt, failures, req)
        prompt_sha = self._save(unit, f"attempt-{attempt}.prompt.md",
                                f"<!-- system -->\n{req.system}\n\n<!-- prompt -->\n{req.prompt}\n")
        response_sha = self._save(unit, f"attempt-{attempt}.response.md", completion.text)
        if not early:
            self._usage(unit, completion)
        answer = Answer(unit, completion.text, Provenance(completion.provider, completion.model, prompt_sha,
                                                          response_sha, attempt))
        chain = gates or registry.names(registry.ANSWER, registry.UNIT)
        ctx = self._context()
        made = extract_candidate(answer, ctx, answer_gates(chain))
        self._open_attempt(made, completion, req, purpose)
        trail = _Trail(unit, attempt, opened=True)
        for res in made.results:
            self._judged(trail, res)
        if made.candidate is None:
            return self._conclude(trail, ctx, None, required)
        return self._gates_and_step(trail, made.candidate, candidate_gates(chain), ctx, required)

    def _open_attempt(self, made: Extraction, completion, req, purpose: str | None) -> None:
        """The attempt record: the answer's provenance and the candidate extraction made of it (None: the
        answer holds none), written before any unit gate judges that candidate."""
        answer, candidate = made.answer, made.candidate
        prov = answer.provenance
        if candidate is not None:
            self._save(answer.unit, f"attempt-{prov.attempt}.candidate.cu", candidate.source)
        self.ledger.append(
            "attempt", target=self.target.name, unit=answer.unit, attempt=prov.attempt, run=self.run_id,
            provider=prov.provider, model=prov.model, prompt_sha256=prov.prompt_sha256,
            response_sha256=prov.response_sha256, candidate_sha256=candidate.sha256 if candidate else None,
            usage=dict(completion.usage or {}), prompt_builder=req.meta["builder"],
            **({"purpose": purpose} if purpose else {}),
        )
        kill_point("after-attempt")

    def reverify(self, step: Step) -> AttemptOutcome:
        """Run the gates that run the candidate (parity, perf) on a unit committed as 'built' before they
        could run here.

        The candidate is the unit file as committed, which passed the gates before the build; the gate
        records carry the step's attempt number.  A pass lands a 'verified' step (a commit of the ledger
        only); a refusal is a failure record of that attempt, so the next attempt starts from its diagnostics.
        """
        candidate = Candidate.of(step.unit, self.target.unit_path(step.unit).read_text())
        # the gates that run the candidate, and those making what they use (the library)
        again = registry.with_producers(registry.names(registry.UNIT, runs_candidate=True))
        return self._gates_and_step(_Trail(step.unit, int(step.attempt or 0)), candidate, again, self._context())

    def _context(self) -> GateContext:
        return GateContext(self.target, self.ws, progress=getattr(self.out, "steps", None))

    def _judged(self, trail: "_Trail", res: GateResult) -> None:
        """A gate's result, as it arrives: its evidence and gate record, its word in the outcome."""
        trail.evidence.append(self._record_gate(trail.unit, trail.attempt, res))
        trail.results.append(res)
        trail.outcome.verdicts.append(verdict_word(res))

    def _gates_and_step(self, trail: "_Trail", candidate: Candidate, gates, ctx: GateContext,
                        required: tuple[str, ...] = ()) -> AttemptOutcome:
        try:
            run_gates(candidate, ctx, gates, on_result=lambda res: self._judged(trail, res))
        except EnvironmentFault as exc:
            # the machine's fault, not the answer's: the attempt opened for it is given up (it counts
            # for nothing, as a crash's would) and the run stops
            if trail.opened:
                self.ledger.append("reconcile", target=self.target.name, unit=trail.unit, attempt=trail.attempt,
                                   action="abandon-attempt", reason=f"environment fault, not the candidate's: {exc}")
            raise
        return self._conclude(trail, ctx, candidate, required)

    def _conclude(self, trail: "_Trail", ctx: GateContext, candidate: Candidate | None,
                  required: tuple[str, ...]) -> AttemptOutcome:
        """The route's end: the refusal (an answer gate's, a unit gate's, or a required gate that did not
        pass) as a failure record, else the step landed."""
        unit, attempt, outcome, results = trail.unit, trail.attempt, trail.outcome, trail.results
        refused = refusal(results)
        unproven = next((g for g in required if not passed(ctx.results.get(g))), None)
        if refused is None and unproven is not None:
            why = ctx.results[unproven].summary if unproven in ctx.results else "it could not run (an earlier gate was skipped)"
            refused = GateResult(unproven, False, f"{unproven} not established: {why}", check="unmeasured")
        if refused is not None:
            dsha = self._diagnostics(refused.diagnostics or refused.summary)
            self.ledger.append("failure", target=self.target.name, unit=unit, attempt=attempt, gate=refused.gate,
                               summary=refused.summary, diagnostics=dsha)
            kill_point("after-failure")
            outcome.gate, outcome.check, outcome.summary = refused.gate, refused.check, refused.summary
            return outcome

        # Every gate that ran passed: write the unit file, record the step, commit them together.
        assert candidate is not None, "an answer gate passed without making a candidate"
        with self.records:
            return self._land_step(unit, attempt, candidate, ctx, trail.evidence, results, outcome)

    def _land_step(self, unit, attempt, candidate, ctx, evidence, results, outcome) -> AttemptOutcome:
        target = self.target
        state = registry.step_state(lambda gate: passed(ctx.results.get(gate)))
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
            # a speedup the gate measured is the commit's headline
            headline = next((ctx.results[g].summary for g in registry.names(registry.SPEEDUP)
                             if passed(ctx.results.get(g))), "")
            sha = commit_step(self.ws, typed(0, raw), headline)
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


def port_unit(unit: str, r: Run, opts, reverify: bool, out_of_time,
              label: str = "") -> tuple[str | None, str | None]:
    """Attempts at one unit until a step lands, its attempts run out, or the run must stop.
    Returns (how it ended: verified/built/exhausted/budget or None, why the run stops or None).
    label: put before each line (the unit's name when several are in flight)."""
    target, ledger, out = r.target, r.ledger, r.out

    def said(what: str, o: AttemptOutcome) -> bool:
        ended = f"{o.state}, committed {o.commit[:10]}" if o.ok else f"{o.gate}: {o.summary}"
        out.line(f"  {label}{what}: {' · '.join(o.verdicts)} -> {ended}", "green" if o.ok else "red")
        return o.ok

    if reverify:
        step = r.history().unit(unit).last_step
        if said(f"committed attempt {step.attempt}", o := r.reverify(step)):
            return o.state, None
    for _ in range(opts.max_attempts):
        if out_of_time():
            return None, f"time budget {opts.time_budget} spent"
        uh = r.history().unit(unit)
        try:
            o = r.attempt(unit, uh.next_attempt, uh.failures_since_step)
        except ProviderError as exc:
            if getattr(exc, "usage", None):
                r._usage(unit, exc)
            if getattr(exc, "scope", None) == "unit":
                out.line(f"  {label or unit + ': '}skipped, {exc}", "yellow")
                return "budget", None
            return "provider", f"provider: {exc}"
        if said(f"attempt {uh.next_attempt}", o):
            return o.state, None
    ledger.append("exhausted", target=target.name, unit=unit, attempts=opts.max_attempts, run=r.run_id)
    kill_point("after-exhausted")
    out.line(f"  {label or unit + ': '}exhausted after {opts.max_attempts} attempt(s) in this run", "red")
    return "exhausted", None
