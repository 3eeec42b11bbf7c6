"""Benchmark: how long `porter status` takes over a long-lived workspace.

    porter dev status-bench [--records 10000] [--repeat 5] [--keep DIR]

Builds (in a temporary directory) a workspace of the bundled minimoe target
whose history looks like a long unattended run: 24 units, each attempted many
times (attempt + usage + static/build/parity gate records with evidence,
failures), a few hundred verified steps each committed with its trailers, every
record Ed25519-signed (a throwaway key under a temporary PORTER_HOME, which
also holds the witness), a couple of units edited after verification. Then it
times status derivation (ledger chain + signature + witness checks, one `git log`, evidence
checks, the static gate over the current unit files, ranking when installed),
median of --repeat runs, and prints e.g.

    status over 10000 records, 268 commits, 24 units: 0.41 s (median of 5; target < 0.5 s)

History is written with `git fast-import` and ledger fsyncs are skipped while
building, so setting up takes seconds, not minutes; the timed part is exactly
what `porter status` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from porter.records.evidence import store_evidence
from porter.digest import sha256_bytes
from porter.records import gitops
from porter.records import signing
from porter.gates import registry
from porter.records.ledger import Ledger
from porter.commands.status import derive
from porter.target import load_target
from porter.workspace import example_target
from porter.term import command_steps

TARGET = example_target()
STALE_EXIT = 4  # the two hand-edited units are stale, by design
# the unit gates a synthetic attempt meets, cheapest first, up to the one judging its output (pass rates
# 0.9, 0.5, 0.3 below): the source's, the library's, the output's
SYNTHETIC_GATES = tuple(registry.names(registry.UNIT, role=r)[0]
                        for r in (registry.SOURCE, registry.LIBRARY, registry.OUTPUT))


def _repo_targets() -> Path:
    return Path(__file__).resolve().parents[2] / "targets"


def _good_source(target, unit: str) -> str:
    """The scripted good answer's code when the target ships one, else a minimal body."""
    md = target.scripted_dir / "good" / f"{unit}.md"
    if md.is_file():
        text = md.read_text()
        start = text.find("```cuda\n")
        if start >= 0:
            end = text.find("\n```", start + 8)
            if end > 0:
                return text[start + 8 : end] + "\n"
    fn = target.api_function(unit)
    return f'#include "mini_cuda.cuh"\n\nextern "C" {fn.c_signature()} {{\n    /* benchmark body */\n}}\n'


class _History:
    """Collects the commits to write with fast-import: (files {rel: bytes|ledger-length}, message)."""

    def __init__(self):
        self.commits: list[tuple[dict, str]] = []

    def fast_import(self, root: Path, ledger_bytes: bytes) -> None:
        out = bytearray()
        # fast-import deltas each blob against the blob written just before it, so the
        # growing ledger versions go first, one after another (a few MB in all, not GBs).
        marks: dict[int, int] = {}
        for files, _ in self.commits:
            for data in files.values():
                if isinstance(data, int) and data not in marks:
                    marks[data] = len(marks) + 1
                    blob = ledger_bytes[:data]
                    out += b"blob\nmark :%d\ndata %d\n" % (marks[data], len(blob)) + blob + b"\n"
        ts = 1_700_000_000
        for n, (files, message) in enumerate(self.commits):
            msg = message.encode()
            out += b"commit refs/heads/main\n"
            out += f"committer porter-bench <bench@localhost> {ts + n} +0000\n".encode()
            out += b"data %d\n" % len(msg) + msg + b"\n"
            for rel, data in files.items():
                if isinstance(data, int):
                    out += f"M 100644 :{marks[data]} {rel}\n".encode()
                else:
                    out += f"M 100644 inline {rel}\n".encode() + b"data %d\n" % len(data) + data + b"\n"
        gitops.read(root, "fast-import", "--quiet", input=bytes(out))
        gitops.read(root, "checkout", "-q", "-f", "main")


def build_workspace(root: Path, records: int = 10_000, seed: int = 7) -> dict:
    """A workspace with about `records` ledger records; returns facts about it."""
    rng = random.Random(seed)
    root = Path(root)
    shutil.copytree(
        _repo_targets() / TARGET,
        root / "targets" / TARGET,
        ignore=shutil.ignore_patterns("ported", "__pycache__", "*.o", "*.so", "*.gguf"),
    )
    (root / "runs").mkdir()
    (root / ".gitignore").write_text("runs/\n")
    gitops.init_repo(root)
    target = load_target(root, TARGET)
    target.ported_dir.mkdir(parents=True)
    signer = signing.create_private(root)
    signing.write_workspace_key(root, signer)
    good = {u: _good_source(target, u) for u in target.units}

    history = _History()
    init_files = {
        p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts
    }
    for unit in target.units:
        rel = target.unit_path(unit).relative_to(root).as_posix()
        init_files[rel] = f"// porter:placeholder\n#include \"mini_cuda.cuh\"\n// {unit}\n".encode()
    history.commits.append((init_files, "porter init\n"))

    led = Ledger(root, signer=signer)
    toolchain = {"nvcc": "12.4.131", "gpu": "NVIDIA H100 80GB HBM3", "driver": "550.54"}
    attempt_no = {u: 0 for u in target.units}
    revision = {u: 0 for u in target.units}
    current: dict[str, str] = {}
    pending: dict[str, bytes] = {}  # evidence files written since the last commit
    steps = 0
    with mock.patch("porter.records.ledger.os.fsync"), mock.patch("porter.records.durable.os.fsync"):
        units = list(target.units)
        seq = 0
        bar = command_steps(f"writing a {records:,}-record signed ledger", records)
        while seq < records:
            bar.advance(seq - bar.done)
            unit = units[rng.randrange(len(units))]
            attempt_no[unit] += 1
            a = attempt_no[unit]
            revision[unit] += 1
            source = good[unit] + f"// revision {revision[unit]}\n"
            cand = sha256_bytes(source.encode())
            common = {"target": TARGET, "unit": unit, "attempt": a}
            led.append("attempt", **common, run=f"run-{a // 10}", provider="anthropic", model="claude",
                       prompt_sha256=sha256_bytes(f"p{unit}{a}".encode()), response_sha256=sha256_bytes(f"r{unit}{a}".encode()),
                       candidate_sha256=cand, usage={"input_tokens": 9000, "output_tokens": 2500, "cost_usd": 0.06})
            seq = led.append("usage", target=TARGET, unit=unit, provider="anthropic", model="claude",
                       input_tokens=9000, output_tokens=2500, cost_usd=0.06)["seq"]
            evidence = []
            failed = None
            for gate, p_ok in zip(SYNTHETIC_GATES, (0.9, 0.5, 0.3)):
                ok = rng.random() < p_ok
                facts = {"target": TARGET, "unit": unit, "gate": gate, "ok": ok, "candidate_sha256": cand,
                         "toolchain": toolchain, "summary": f"{gate} {'ok' if ok else 'failed'}"}
                if gate == SYNTHETIC_GATES[-1]:
                    facts.update(seeds=[rng.randrange(1 << 30), rng.randrange(1 << 30)], metrics={"nmse": 1e-9})
                sha = store_evidence(root, facts)
                pending[f"ledger/evidence/{sha}.json"] = (root / f"ledger/evidence/{sha}.json").read_bytes()
                seq = led.append("gate", **common, gate=gate, ok=ok, skipped=False, summary=facts["summary"],
                                 evidence=sha)["seq"]
                evidence.append(sha)
                if not ok:
                    failed = gate
                    diag = sha256_bytes(f"{unit}{a}{gate}".encode())
                    seq = led.append("failure", **common, gate=gate, summary=f"{gate} failed: mismatch at [17]",
                                     diagnostics=diag)["seq"]
                    break
            if failed is None:
                target.unit_path(unit).write_text(source)
                current[unit] = source
                step = led.append("step", **common, state="verified", candidate_sha256=cand,
                                  unit_file=target.unit_path(unit).relative_to(root).as_posix(), evidence=evidence)
                seq = step["seq"]
                steps += 1
                msg = "\n".join(
                    [f"porter: verified {unit} (attempt {a})", "", f"Porter-Unit: {unit}", f"Porter-Target: {TARGET}",
                     "Porter-State: verified", f"Porter-Candidate: {cand}", f"Porter-Step: {step['hash']}"]
                    + [f"Porter-Evidence: {e}" for e in evidence]
                ) + "\n"
                files = {target.unit_path(unit).relative_to(root).as_posix(): source.encode(),
                         "ledger/ledger.jsonl": led.path.stat().st_size}
                files.update(pending)
                pending = {}
                history.commits.append((files, msg))
            elif a % 40 == 0:
                seq = led.append("exhausted", target=TARGET, unit=unit, attempts=a)["seq"]
        history.commits.append(({"ledger/ledger.jsonl": led.path.stat().st_size, **pending}, "porter: run end\n"))
        bar.stop()
    for unit, source in current.items():  # the loop wrote each verified file as it went
        target.unit_path(unit).write_text(source)
    history.fast_import(root, led.path.read_bytes())
    # two hand edits after verification: status must call them stale
    edited = [u for u in target.units if u in current][:2]
    for unit in edited:
        with open(target.unit_path(unit), "a") as f:
            f.write("// edited by hand\n")
    return {"records": _count_lines(led), "commits": len(history.commits), "steps": steps, "units": len(target.units)}


def _count_lines(led: Ledger) -> int:
    try:
        with open(led.path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev status-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", metavar="DIR", help="build the workspace in DIR and keep it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = None
    home = tempfile.TemporaryDirectory(prefix="porter-bench-home-")
    saved = {k: os.environ.get(k) for k in (signing.HOME_ENV, signing.KEY_ENV, signing.TRUST_ENV, "PORTER_WITNESS_DIR")}
    for k in saved:
        os.environ.pop(k, None)
    os.environ[signing.HOME_ENV] = home.name  # a throwaway key and witness, never the user's
    if args.keep:
        root = Path(args.keep)
        root.mkdir(parents=True, exist_ok=False)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="porter-bench-")
        root = Path(tmp.name) / "ws"
    try:
        t0 = time.perf_counter()
        facts = build_workspace(root, args.records)
        build_s = time.perf_counter() - t0
        target = load_target(root, TARGET)
        times = []
        report = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            report = derive(root, TARGET, key=None, target=target)
            times.append(time.perf_counter() - t)
        led_times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            Ledger(root).verify()
            led_times.append(time.perf_counter() - t)
        med = statistics.median(times)
        result = {
            **facts,
            "build_s": round(build_s, 2),
            "status_median_s": round(med, 3),
            "status_runs_s": [round(t, 3) for t in times],
            "ledger_verify_median_s": round(statistics.median(led_times), 3),
            "exit_code": report.exit_code,
            "counts": report.counts,
            "ledger": report.ledger["key"] if report.ledger["ok"] else report.ledger["problems"][:1],
        }
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(
                f"status over {facts['records']} records, {facts['commits']} commits, {facts['units']} units: "
                f"{med:.2f} s (median of {args.repeat}; target < 0.5 s)"
            )
            print(f"  of which ledger chain + signature verification ({report.ledger['key']}): {result['ledger_verify_median_s']:.2f} s; "
                  f"workspace built in {build_s:.1f} s")
            print(f"  states: {', '.join(f'{v} {k}' for k, v in report.counts.items() if v and k != 'total')}; "
                  f"exit {report.exit_code}")
        return 0 if report.exit_code == STALE_EXIT and report.ledger["ok"] else 1
    finally:
        if tmp is not None:
            tmp.cleanup()
        home.cleanup()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    sys.exit(main())
