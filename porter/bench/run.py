"""Benchmark: units per hour of `porter run` at --jobs 1 and --jobs N, with a provider that
answers after a fixed delay (a model that thinks for a minute, without the model).

    porter dev run-bench [--delay 60] [--jobs 1,8] [--max-units N] [--json FILE]

Each measured run starts from a fresh minimoe workspace (porter init) with the
scripted provider behind DelayedProvider.  A first run with no delay fills the
shared build cache, so no measured run pays for compiling what another reused.
Units per hour = units that ended (verified, built or exhausted) / wall time.
Printed figures, not a test: on a GPU machine parity and perf run too; on a CPU
one they are skipped and the builds are real.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from porter.records.history import Attempt, Exhausted, History, Step
from porter.run import RunOptions, run
from porter.workspace import example_target, init_workspace
from porter.term import command_steps


def one_run(root: Path, name: str, jobs: int, delay: float, max_units: int | None) -> dict:
    target = example_target()
    ws = init_workspace(root / name, [target])
    t0 = time.monotonic()
    rc = run(RunOptions(ws, target, quiet=True, max_units=max_units, jobs=jobs,
                        provider={"provider": "scripted", "answer_delay_s": delay}))
    wall = time.monotonic() - t0
    recs = History.read(ws, target).mine
    ended = {r.unit for r in recs if isinstance(r, (Step, Exhausted))}
    attempts = sum(1 for r in recs if isinstance(r, Attempt))
    return {"jobs": jobs, "rc": rc, "wall_s": wall, "units": len(ended), "attempts": attempts,
            "units_per_hour": len(ended) / wall * 3600 if wall > 0 else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev run-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=60.0, help="seconds before each answer (default 60)")
    ap.add_argument("--jobs", default="1,8", help="comma list of --jobs values (default 1,8)")
    ap.add_argument("--max-units", type=int, default=None, help="units per run (default: all)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="porter-run-bench-"))
    os.environ.setdefault("PORTER_BUILD_CACHE", str(root / "build-cache"))
    try:
        t0 = time.monotonic()
        one_run(root, "warm-up", 1, 0.0, a.max_units)
        print(f"warm-up run (no delay, fills the build cache): {time.monotonic() - t0:.0f} s")
        rows = []
        jobs = [int(x) for x in a.jobs.split(",")]
        steps = command_steps("measured runs", len(jobs))
        for j in jobs:
            steps.working_on(f"--jobs {j}")
            r = one_run(root, f"jobs-{j}", j, a.delay, a.max_units)
            steps.advance()
            rows.append(r)
            print(f"--jobs {j}: {r['units']} units ({r['attempts']} attempts) in {r['wall_s']:.0f} s = "
                  f"{r['units_per_hour']:.1f} units/hour (answer delay {a.delay:g} s, rc {r['rc']})")
        steps.stop()
        if len(rows) >= 2 and rows[0]["units_per_hour"]:
            ratio = rows[-1]["units_per_hour"] / rows[0]["units_per_hour"]
            print(f"speed-up --jobs {rows[-1]['jobs']} vs --jobs {rows[0]['jobs']}: {ratio:.1f}x "
                  f"(target >= 6x at jobs 8 with a 60 s delay: {'met' if ratio >= 6 else 'NOT met'})")
        if a.json:
            Path(a.json).write_text(json.dumps({"delay_s": a.delay, "rows": rows}, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
