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

import hashlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from porter import gitops
from porter.durable import write_atomic
from porter.errors import PorterError
from porter.gates.result import GateResult

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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.log_path = log_path
        self.quiet = quiet
        self._log = open(log_path, "a", buffering=1) if log_path else None

    def line(self, text: str, style: str | None = None) -> None:
        from rich.markup import escape

        if not self.quiet:
            self.console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
        if self._log:
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
            self._log.write(f"{stamp} {text}\n")

    def close(self) -> None:
        if self._log:
            self._log.close()
            self._log = None


# ---------------------------------------------------------------- ledger views


def _abandoned(records: list[dict], target: str) -> set[tuple[str, int]]:
    return {
        (r.get("unit"), r.get("attempt"))
        for r in records
        if r.get("kind") == "reconcile" and r.get("target", target) == target
        and str(r.get("action", "")).startswith("abandon") and r.get("attempt") is not None
    }


def _mine(records: list[dict], target: str, unit: str, kind: str) -> list[dict]:
    return [r for r in records if r.get("kind") == kind and r.get("target") == target and r.get("unit") == unit]


def next_attempt_number(records: list[dict], target: str, unit: str) -> int:
    return 1 + max((int(r.get("attempt") or 0) for r in _mine(records, target, unit, "attempt")), default=0)


def live_steps(records: list[dict], target: str, unit: str) -> list[dict]:
    abandoned_steps = {r.get("step") for r in records if r.get("kind") == "reconcile" and r.get("action") == "abandon-step"}
    return [r for r in _mine(records, target, unit, "step") if r.get("hash") not in abandoned_steps]


def done_state(records: list[dict], target, unit: str) -> str | None:
    """'built' / 'verified' when a live step's candidate is the unit file as it is now."""
    path = target.unit_path(unit)
    if not path.is_file():
        return None
    sha = sha256_bytes(path.read_bytes())
    for r in reversed(live_steps(records, target.name, unit)):
        if r.get("candidate_sha256") == sha:
            return r.get("state")
    return None


def committed_candidate_refuted(records: list[dict], target: str, unit: str) -> bool:
    """A parity/perf failure of the latest live step's own attempt, recorded after that step."""
    steps = live_steps(records, target, unit)
    if not steps:
        return False
    last = steps[-1]
    return any(r.get("seq", 0) > last.get("seq", 0) and r.get("attempt") == last.get("attempt")
               and r.get("gate") in ("parity", "perf") for r in _mine(records, target, unit, "failure"))


def is_exhausted(records: list[dict], target: str, unit: str) -> bool:
    """An "exhausted" record newer than the unit's latest live step."""
    last_step = max((r.get("seq", 0) for r in live_steps(records, target, unit)), default=0)
    return any(r.get("seq", 0) > last_step for r in _mine(records, target, unit, "exhausted"))


def failures_since_step(workspace: Path, records: list[dict], target: str, unit: str) -> list[dict]:
    """Failure records of `unit` after its latest live step, each with `diagnostics_text`."""
    last_step = max((r.get("seq", 0) for r in live_steps(records, target, unit)), default=0)
    out = []
    for r in _mine(records, target, unit, "failure"):
        if r.get("seq", 0) <= last_step:
            continue
        d = dict(r)
        p = workspace / "runs" / "diagnostics" / f"{r.get('diagnostics')}.txt"
        d["diagnostics_text"] = p.read_text() if p.is_file() else r.get("summary", "")
        out.append(d)
    return out


# ---------------------------------------------------------------- reconcile


def _ledger_paths() -> list[str]:
    return ["ledger"]


def commit_step(workspace: Path, step: dict) -> str:
    msg = gitops.step_message(step["target"], step["unit"], step["state"], int(step["attempt"]),
                              step["candidate_sha256"], step["hash"], list(step.get("evidence") or []))
    return gitops.commit_paths(workspace, [step["unit_file"], *_ledger_paths()], msg)


def reconcile(workspace: Path, target, ledger, out: Reporter) -> list[str]:
    """Make ledger and git agree after a crash; return one line per repair made."""
    gitops.check_index_unlocked(workspace)
    done: list[str] = []
    records = ledger.records()
    name = target.name

    # 1. step records whose commit is missing.
    settled = {r.get("step") for r in records if r.get("kind") == "reconcile" and r.get("action") == "abandon-step"}
    for step in [r for r in records if r.get("kind") == "step" and r.get("target") == name]:
        if step.get("hash") in settled or gitops.commits_with_trailer(workspace, "Porter-Step", step["hash"]):
            continue
        path = workspace / step["unit_file"]
        on_disk = sha256_bytes(path.read_bytes()) if path.is_file() else None
        if on_disk == step.get("candidate_sha256"):
            ledger.append("reconcile", target=name, unit=step["unit"], attempt=step["attempt"], action="commit-step",
                          committed_step=step["hash"], reason="step recorded but not committed (run interrupted)")
            sha = commit_step(workspace, step)
            done.append(f"committed the interrupted step of {step['unit']} (attempt {step['attempt']}) as {sha[:10]}")
        else:
            ledger.append("reconcile", target=name, unit=step["unit"], attempt=step["attempt"], action="abandon-step",
                          step=step["hash"], reason=f"unit file is not the step's candidate (file sha256 {on_disk})")
            done.append(f"abandoned the uncommitted step of {step['unit']} (attempt {step['attempt']}): file changed")
        kill_point("after-reconcile")

    # 2. attempts that never reached a verdict.
    records = ledger.records()
    abandoned = _abandoned(records, name)
    concluded = {(r.get("unit"), r.get("attempt")) for r in records
                 if r.get("kind") in ("failure", "step") and r.get("target") == name}
    candidates_of_open: dict[str, set[str]] = {}
    for a in [r for r in records if r.get("kind") == "attempt" and r.get("target") == name]:
        key = (a.get("unit"), a.get("attempt"))
        if key in concluded or key in abandoned:
            continue
        ledger.append("reconcile", target=name, unit=a["unit"], attempt=a["attempt"], action="abandon-attempt",
                      reason="the run ended before this attempt's verdict (crash or kill); it is tried again")
        abandoned.add(key)
        if a.get("candidate_sha256"):
            candidates_of_open.setdefault(a["unit"], set()).add(a["candidate_sha256"])
        done.append(f"abandoned attempt {a['attempt']} of {a['unit']} (no verdict recorded)")
        kill_point("after-reconcile")

    # 3. unit files an interrupted run wrote without recording a step: back to the committed version.
    records = ledger.records()
    porter_written = {r.get("candidate_sha256") for r in records if r.get("kind") == "attempt" and r.get("target") == name}
    rel_dir = str(target.ported_dir.relative_to(workspace))
    for rel in gitops.dirty_paths(workspace, rel_dir):
        unit = Path(rel).stem
        if unit not in target.units:
            continue
        path = workspace / rel
        sha = sha256_bytes(path.read_bytes()) if path.is_file() else None
        if any(s.get("candidate_sha256") == sha for s in live_steps(records, name, unit)):
            continue
        if sha in porter_written or sha in candidates_of_open.get(unit, set()):
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


def builtin_prompt(target, unit: str, attempt: int, failures: list[dict]):
    """A minimal prompt for when porter.prompt is not installed: signature, doc, conventions, failures."""
    from porter.providers.base import PromptRequest

    fn = target.api_function(unit)
    conv = target.conventions_header.read_text()
    parts = [
        f"Port the backend API function `{unit}` of target {target.name} to CUDA.",
        "",
        "Exact C signature (from the API header; define it extern \"C\" with exactly this signature):",
        f"    {fn.c_signature()};",
    ]
    if fn.doc:
        parts += ["", "Header documentation:", fn.doc]
    parts += ["", f"CUDA conventions header ({target.conventions_header.name}, force-included):", "```cuda", conv.rstrip(), "```"]
    for f in failures[-3:]:
        parts += ["", f"Attempt {f.get('attempt')} was refused by the {f.get('gate')} gate: {f.get('summary')}"]
        text = (f.get("diagnostics_text") or "").strip()
        if text and text != f.get("summary"):
            parts += ["```", text[:3000], "```"]
    parts += ["", f"Answer with exactly one ```cuda code block holding the whole file for {unit}: "
              f"#include \"{target.conventions_header.name}\", static __global__ kernels, and the extern \"C\" function."]
    system = ("You port Metal GPU kernels to CUDA. You write one complete, compilable CUDA translation unit per "
              "answer. Never stub, never return an error instead of doing the work.")
    return PromptRequest(target=target.name, unit=unit, attempt=attempt, system=system, prompt="\n".join(parts),
                         meta={"builder": "builtin-minimal"})


def make_prompt(target, unit: str, attempt: int, failures: list[dict]):
    try:
        from porter.prompt import build_prompt
    except ImportError:
        return builtin_prompt(target, unit, attempt, failures)
    req = build_prompt(target, unit, attempt, failures)
    if isinstance(getattr(req, "meta", None), dict):
        req.meta.setdefault("builder", "porter.prompt")
    return req


def parity_gate():
    """(module, None) when the parity gate can run here, else (None, why not)."""
    try:
        from porter.gates import parity
    except ImportError as exc:
        return None, f"parity gate not installed ({exc})"
    try:
        ok, reason = parity.available()
    except Exception as exc:  # noqa: BLE001 - a broken probe means: not available, say why
        return None, f"parity gate unavailable: {type(exc).__name__}: {exc}"
    return (parity, None) if ok else (None, reason)


class Run:
    def __init__(self, workspace: Path, target, provider, ledger, out: Reporter, run_id: str, run_dir: Path):
        self.ws = workspace
        self.target = target
        self.provider = provider
        self.ledger = ledger
        self.out = out
        self.run_id = run_id
        self.run_dir = run_dir
        from porter.gates.build import cache_dir

        self.build_cache = cache_dir(workspace)
        self.parity, self.parity_reason = parity_gate()
        self.commits: list[str] = []

    # -- helpers --
    def _save(self, unit: str, name: str, text: str) -> tuple[Path, str]:
        d = self.run_dir / unit
        d.mkdir(parents=True, exist_ok=True)
        p = d / name
        data = text.encode()
        p.write_bytes(data)
        return p, sha256_bytes(data)

    def _diagnostics(self, text: str) -> str:
        data = text.encode()
        sha = sha256_bytes(data)
        d = self.ws / "runs" / "diagnostics"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{sha}.txt"
        if not p.is_file():
            write_atomic(p, data)
        return sha

    def _record_gate(self, unit: str, attempt: int, res: GateResult) -> str:
        from porter.evidence import store_evidence

        ev = dict(res.evidence)
        ev.setdefault("target", self.target.name)
        ev.setdefault("unit", unit)
        ev.setdefault("gate", res.gate)
        ev.setdefault("ok", res.ok)
        ev.setdefault("candidate_sha256", None)
        ev.setdefault("toolchain", {})
        ev.setdefault("skipped", res.skipped)
        ev.setdefault("summary", res.summary)
        ev["run"] = self.run_id
        ev["attempt"] = attempt
        sha = store_evidence(self.ws, ev)
        kill_point("after-evidence")
        self.ledger.append("gate", target=self.target.name, unit=unit, attempt=attempt, gate=res.gate, ok=res.ok,
                           skipped=res.skipped, summary=res.summary, evidence=sha)
        kill_point("after-gate")
        return sha

    # -- the attempt --
    def attempt(self, unit: str, attempt: int, failures: list[dict]) -> AttemptOutcome:
        from porter.extract import ExtractionError, extract_unit_source

        target = self.target
        req = make_prompt(target, unit, attempt, failures)
        completion = self.provider.complete(req)
        prompt_text = f"<!-- system -->\n{req.system}\n\n<!-- prompt -->\n{req.prompt}\n"
        _, prompt_sha = self._save(unit, f"attempt-{attempt}.prompt.md", prompt_text)
        _, response_sha = self._save(unit, f"attempt-{attempt}.response.md", completion.text)
        self._usage(unit, completion)

        try:
            source = extract_unit_source(completion.text, unit, target)
            cand_sha = sha256_bytes(source.encode())
            self._save(unit, f"attempt-{attempt}.candidate.cu", source)
            extract = GateResult("extract", True, f"one code block defines {unit} ({len(source.splitlines())} lines)")
        except ExtractionError as exc:
            source, cand_sha = None, None
            extract = GateResult("extract", False, str(exc), diagnostics=str(exc))
        extract.evidence = {"target": target.name, "unit": unit, "gate": "extract", "ok": extract.ok,
                            "candidate_sha256": cand_sha, "response_sha256": response_sha,
                            "toolchain": {"extractor": "porter.extract"}, "summary": extract.summary}

        meta = getattr(req, "meta", {}) or {}
        self.ledger.append(
            "attempt", target=target.name, unit=unit, attempt=attempt, run=self.run_id,
            provider=completion.provider, model=completion.model, prompt_sha256=prompt_sha,
            response_sha256=response_sha, candidate_sha256=cand_sha, usage=dict(completion.usage or {}),
            prompt_builder=meta.get("builder", "porter.prompt"),
        )
        kill_point("after-attempt")

        return self._gates_and_step(unit, attempt, source, cand_sha, extract)

    def reverify(self, unit: str, step: dict) -> AttemptOutcome:
        """Run parity (and perf) on a unit that was committed as 'built' before parity could run here.

        The candidate is the unit file as committed; the gate records carry the step's attempt
        number.  A pass lands a 'verified' step (a commit of the ledger only); a refusal is a
        failure record of that attempt, so the next attempt starts from its diagnostics.
        """
        source = self.target.unit_path(unit).read_text()
        cand_sha = sha256_bytes(source.encode())
        return self._gates_and_step(unit, int(step.get("attempt", 0)), source, cand_sha, None,
                                    gates=("build", "parity", "perf"))

    def _gates_and_step(self, unit: str, attempt: int, source: str | None, cand_sha: str | None,
                        extract: GateResult | None, gates=("extract", "static", "build", "parity", "perf"),
                        ) -> AttemptOutcome:
        from porter.gates import build, perf, static

        target = self.target
        outcome = AttemptOutcome(ok=False)
        evidence: list[str] = []
        results: list[GateResult] = []
        parity_passed = False
        for gate in gates:
            if gate == "extract":
                res = extract
            elif gate == "static":
                res = static.check(target, unit, source)
            elif gate == "build":
                res = build.check(target, unit, source, self.build_cache)
            elif gate == "parity":
                if self.parity is None:
                    res = GateResult("parity", False, f"parity not run: {self.parity_reason}", skipped=True,
                                     evidence={"reason": self.parity_reason, "candidate_sha256": cand_sha})
                else:
                    library = Path(results[-1].evidence["library"])
                    res = self._parity_check(unit, library, cand_sha)
            else:  # perf: only on a candidate parity measured and passed
                if not parity_passed:
                    break
                res = perf.check(target, unit, results[-1], self.ws)
            results.append(res)
            if gate == "parity" and res.ok and not res.skipped:
                parity_passed = True
            res.evidence.setdefault("candidate_sha256", cand_sha)
            evidence.append(self._record_gate(unit, attempt, res))
            outcome.verdicts.append(f"{gate} " + ("skipped" if res.skipped else "ok" if res.ok else "REFUSED"))
            if not res.ok and not res.skipped:
                dsha = self._diagnostics(res.diagnostics or res.summary)
                self.ledger.append("failure", target=target.name, unit=unit, attempt=attempt, gate=gate,
                                   summary=res.summary, diagnostics=dsha)
                kill_point("after-failure")
                outcome.gate, outcome.summary = gate, res.summary
                return outcome

        # Every gate that ran passed: write the unit file, record the step, commit them together.
        state = "verified" if parity_passed else "built"
        path = target.unit_path(unit)
        if not path.is_file() or sha256_bytes(path.read_bytes()) != cand_sha:
            write_atomic(path, source.encode())
        kill_point("after-unit-file")
        step = self.ledger.append(
            "step", target=target.name, unit=unit, attempt=attempt, state=state, candidate_sha256=cand_sha,
            unit_file=str(path.relative_to(self.ws)), evidence=evidence, run=self.run_id,
        )
        kill_point("after-step")
        sha = commit_step(self.ws, step)
        kill_point("after-commit")
        self.commits.append(sha)
        outcome.ok, outcome.state, outcome.commit = True, state, sha
        outcome.summary = next((r.summary for r in reversed(results) if not r.skipped), results[-1].summary)
        return outcome

    def can_verify(self, unit: str) -> bool:
        """Parity can run here and the unit has a spec (runtime units have none)."""
        if self.parity is None:
            return False
        try:
            from porter.gates.parity.spec import load_spec

            return load_spec(self.target, unit) is not None
        except PorterError:
            return False

    def _parity_check(self, unit: str, library: Path, cand_sha: str) -> GateResult:
        """The parity gate on the freshly linked library; it is told which candidate that library holds
        (the unit file on disk is still the previous version until the step is recorded)."""
        import inspect

        try:
            takes_sha = "candidate_sha256" in inspect.signature(self.parity.check).parameters
        except (TypeError, ValueError):
            takes_sha = False
        if takes_sha:
            return self.parity.check(self.target, unit, library, self.ws, candidate_sha256=cand_sha)
        return self.parity.check(self.target, unit, library, self.ws)

    def _usage(self, unit: str, completion) -> None:
        """A "usage" record for a provider call (a Completion, or a ProviderError carrying .usage)."""
        if getattr(completion, "provider", None) == "scripted" or getattr(self.provider, "name", None) == "scripted":
            return  # replayed answers cost nothing; the attempt record names the answer file
        try:
            from porter.providers.budget import usage_record
        except ImportError:
            return
        self.ledger.append("usage", **usage_record(completion, target=self.target.name, unit=unit))


# ---------------------------------------------------------------- the run


def ordered_units(target, out: Reporter) -> list[str]:
    runtime = [u for u in target.units if u in target.runtime_units]
    fallback = runtime + [u for u in target.units if u not in runtime]
    try:
        from porter.plan import ranked_units
    except ImportError:
        out.line("order: header order, runtime units first (porter.plan is not installed)", "dim")
        return fallback
    try:
        ranked = [r.unit for r in ranked_units(target)]
    except PorterError as exc:
        out.line(f"order: header order, runtime units first (ranking failed: {exc})", "yellow")
        return fallback
    order = [u for u in ranked if u in target.units]
    return order + [u for u in fallback if u not in order]


def provider_options(args) -> dict:
    keys = ("provider", "model", "base_url", "price_input", "price_output", "budget_run_usd", "budget_unit_usd",
            "budget_run_tokens", "budget_unit_tokens", "flaws")
    return {k: getattr(args, k, None) for k in keys if getattr(args, k, None) is not None}


def run(args) -> int:
    from porter.gates.build import nvcc_path
    from porter.ledger import Ledger, load_key
    from porter.lock import RunLock
    from porter.providers import ProviderError, get_provider
    from porter.target import load_target

    ws: Path = args.workspace
    target = load_target(ws, args.target, getattr(args, "source", None))
    explicit = list(dict.fromkeys(getattr(args, "unit", None) or []))  # repeated --unit: once
    for u in explicit:
        target.api_function(u)  # unknown unit -> one-line error
        if u not in target.units:
            raise PorterError(f"{u} is listed in [units].skip of {target.name}'s target.toml: it is not ported")
    max_attempts = getattr(args, "max_attempts", None)
    max_attempts = 3 if max_attempts is None else int(max_attempts)
    if max_attempts < 1:
        raise PorterError("--max-attempts must be at least 1")
    budget_s = parse_duration(getattr(args, "time_budget", None))
    max_units = getattr(args, "max_units", None)
    nvcc_path()  # before anything is written: no nvcc, no run
    if not target.conventions_header.is_file():
        raise PorterError(f"target {target.name} has no CUDA conventions header "
                          f"({target.conventions_header.relative_to(ws)}): units cannot build until it is written")
    key = load_key(ws)
    provider = get_provider(getattr(args, "provider", None), target, provider_options(args))

    lock = RunLock(ws)
    if not lock.acquire():
        pid = lock.holder()
        print(f"porter: another porter run is active (pid {pid if pid else '?'}); nothing to do")
        return 0
    started = time.monotonic()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    run_dir = ws / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Reporter(run_dir / "run.log", quiet=bool(getattr(args, "quiet", False)))
    try:
        ledger = Ledger(ws, key)
        if ledger.repair_torn_tail():
            out.line("ledger: a torn last line (interrupted write) was moved aside and recorded", "yellow")
        for line in reconcile(ws, target, ledger, out):
            out.line(f"reconcile: {line}", "yellow")
        if hasattr(getattr(provider, "budget", None), "seed"):
            provider.budget.seed(ledger.records())

        records = ledger.records()
        order = explicit or ordered_units(target, out)
        r = Run(ws, target, provider, ledger, out, run_id, run_dir)
        todo, skipped, reverify = [], [], set()
        for u in order:
            state = done_state(records, target, u)
            if state == "built" and r.can_verify(u):
                if not committed_candidate_refuted(records, target.name, u):
                    # committed before parity could run here: verify the committed file first
                    reverify.add(u)
                    todo.append(u)
                    continue
                state = None  # its committed candidate failed parity or perf: port it again
            if state:
                skipped.append(f"{u} ({state})")
            elif not explicit and is_exhausted(records, target.name, u):
                skipped.append(f"{u} (exhausted earlier; retry with --unit {u})")
            else:
                todo.append(u)
        for line in skipped if explicit else []:
            out.line(f"{line}: nothing to do", "dim")
        describe = provider.describe() if hasattr(provider, "describe") else getattr(provider, "name", "?")
        out.line(f"porter run {run_id}: target {target.name}, provider {describe}, "
                 f"{len(todo)} unit(s) to port, {len(skipped)} already done or skipped", "bold")
        if r.parity is None:
            out.line(f"parity: not available here ({r.parity_reason}); passing units are committed as 'built'", "yellow")
        results: dict[str, str] = {}
        stop_reason = None
        for i, unit in enumerate(todo):
            if max_units is not None and i >= max_units:
                stop_reason = f"--max-units {max_units} reached"
                break
            kind = "runtime" if unit in target.runtime_units else "op"
            out.line(f"[{i + 1}/{len(todo)}] {unit} ({kind})", "bold cyan")
            ended = None
            if unit in reverify:
                step = live_steps(ledger.records(), target.name, unit)[-1]
                o = r.reverify(unit, step)
                verdicts = " · ".join(o.verdicts)
                if o.ok:
                    out.line(f"  committed attempt {step.get('attempt')}: {verdicts} -> {o.state}, "
                             f"committed {o.commit[:10]}", "green")
                    results[unit] = o.state
                    continue
                out.line(f"  committed attempt {step.get('attempt')}: {verdicts} -> {o.gate}: {o.summary}", "red")
            for k in range(max_attempts):
                if budget_s is not None and time.monotonic() - started > budget_s:
                    stop_reason = f"time budget {args.time_budget} spent"
                    break
                records = ledger.records()
                n = next_attempt_number(records, target.name, unit)
                failures = failures_since_step(ws, records, target.name, unit)
                try:
                    o = r.attempt(unit, n, failures)
                except ProviderError as exc:
                    if getattr(exc, "usage", None):
                        r._usage(unit, exc)
                    scope = getattr(exc, "scope", None)
                    if scope == "unit":
                        out.line(f"  {unit}: skipped, {exc}", "yellow")
                        ended = "budget"
                        break
                    stop_reason = f"provider: {exc}"
                    ended = "provider"
                    break
                verdicts = " · ".join(o.verdicts)
                if o.ok:
                    out.line(f"  attempt {n}: {verdicts} -> {o.state}, committed {o.commit[:10]}", "green")
                    ended = o.state
                    break
                out.line(f"  attempt {n}: {verdicts} -> {o.gate}: {o.summary}", "red")
            if ended is None and stop_reason is None:
                ledger.append("exhausted", target=target.name, unit=unit, attempts=max_attempts, run=run_id)
                kill_point("after-exhausted")
                out.line(f"  {unit}: exhausted after {max_attempts} attempt(s) in this run", "red")
                ended = "exhausted"
            if ended:
                results[unit] = ended
            if stop_reason:
                break

        # Records since the last step commit (failures, exhausted, reconcile) are committed too.
        if gitops.dirty_paths(ws, "ledger"):
            n_fail = sum(1 for v in results.values() if v == "exhausted")
            gitops.commit_paths(ws, _ledger_paths(), f"porter: ledger of run {run_id} ({n_fail} unit(s) exhausted)\n\n"
                                                     f"Porter-Run: {run_id}\nPorter-Target: {target.name}\n")
        counts = {s: sum(1 for v in results.values() if v == s) for s in ("verified", "built", "exhausted")}
        tail = f"; stopped: {stop_reason}" if stop_reason else ""
        out.line(f"run {run_id}: {counts['verified']} verified, {counts['built']} built, {counts['exhausted']} exhausted, "
                 f"{len(r.commits)} step commit(s){tail}; log: {(run_dir / 'run.log').relative_to(ws)}", "bold")
        failed = counts["exhausted"] > 0 or (stop_reason or "").startswith("provider")
        return 1 if failed else 0
    finally:
        out.close()
        lock.release()
