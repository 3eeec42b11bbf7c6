"""One GPU-machine call: a target's calibration through the local pool, then through Ray on the same
GPUs; the two tables side by side, with wall times (issue 32's measurement; not a pytest file).

    python3 tests/gpu_ray_vs_local_calibration.py --target ds4 --known-good upstream [--chunk 1/3] [--out DIR]

Options it does not know (--timing-reps 0, --no-mutants, ...) are given to both calibrate runs.

Both runs use --no-ledger and the same object cache (the first run's known-good and mutant builds are
cached for the second: compare the 'parity s' column, which leaves the build out).  Exit 0 when every
row has the same verdict both ways.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def calibrate(extra: list[str], report: Path, args, passed: list[str]) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "porter", "-C", str(REPO), "calibrate", "--target", args.target,
           "--known-good", args.known_good, "--no-ledger", "--report", str(report)] + extra + passed
    if args.chunk:
        cmd += ["--chunk", args.chunk]
    for u in args.unit or []:
        cmd += ["--unit", u]
    t0 = time.monotonic()
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)  # carried wheels stay
    log = report.with_suffix(".log")
    # written as it goes: a run killed at the machine's time limit still shows how far it got
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1"),
                            stdout=fh, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    if not report.is_file():
        sys.exit(f"calibrate {' '.join(extra)} wrote no report (rc {rc}):\n{log.read_text()[-3000:]}")
    return json.loads(report.read_text()), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="ds4")
    ap.add_argument("--known-good", default="upstream")
    ap.add_argument("--chunk", help="only this part of the specs (I/N), both ways")
    ap.add_argument("--unit", action="append")
    ap.add_argument("--jobs", type=int, help="local --jobs (default: calibrate's); Ray's is the cluster's GPUs")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="reports and logs go here")
    args, passed = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    local, local_wall = calibrate(["--jobs", str(args.jobs)] if args.jobs else [], out / "local.json", args, passed)
    ray, ray_wall = calibrate(["--executor", "ray"], out / "ray.json", args, passed)
    key = lambda r: (r["unit"], r["kind"], r["name"])  # noqa: E731
    a, b = {key(r): r for r in local["rows"]}, {key(r): r for r in ray["rows"]}
    same = 0
    print(f"{'unit':<44} {'kind':<12} {'name':<34} {'local':<14} {'ray':<14} same")
    for k in sorted(set(a) | set(b)):
        la, rb = a.get(k, {}), b.get(k, {})
        eq = (la.get("got"), la.get("ok")) == (rb.get("got"), rb.get("ok"))
        same += eq
        print(f"{k[0]:<44} {k[1]:<12} {k[2][:34]:<34} {str(la.get('got')):<14} {str(rb.get('got')):<14} "
              f"{'yes' if eq else 'NO'}")
    n = len(set(a) | set(b))
    for name, rep, wall in (("local", local, local_wall), ("ray", ray, ray_wall)):
        print(f"{name:<6} wall {wall:7.1f} s; calibrate {rep['seconds']:7.1f} s, of which build "
              f"{rep.get('build_seconds', 0):6.1f} s, parity s {rep['seconds'] - rep.get('build_seconds', 0):7.1f}; "
              f"{sum(r['ok'] for r in rep['rows'])}/{len(rep['rows'])} rows behaved")
    print(f"{same}/{n} rows with the same verdict both ways")
    return 0 if same == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
