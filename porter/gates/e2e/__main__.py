"""python3 -m porter.gates.e2e {calibrate,run} --target NAME ...

  calibrate  run every backend of targets/NAME/e2e/variants.toml (mode cpu: the CPU rows;
             mode cuda: all rows, faults on porter's scripted CUDA backend), print the table,
             and with --write store the rule where target.toml's [e2e] calibration names it
  run        the gate itself: --library PATH (the workspace's backend), or --library scripted
             (build porter's CUDA backend from the scripted good answers; evidence is then
             not stored, since that library is not the workspace's tree)
  logprob    ds4: build ds4_test against --library and run the official logprob vectors on
             --model (the user's real GGUF); the result is stored as e2e evidence
  prepare    ds4: write the synthetic GGUF and run every build into --scratch (the slow half
             of `calibrate`, which then reuses them)
  build      minimoe: build every calibration backend of --mode and link the engines, run
             nothing (checks the plan on a machine without a GPU)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from porter.errors import PorterError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m porter.gates.e2e")
    ap.add_argument("command", choices=["calibrate", "run", "logprob", "build", "prepare"])
    ap.add_argument("--target", required=True)
    ap.add_argument("--workspace", type=Path, default=Path("."))
    ap.add_argument("--source", default=None, help="the target's source checkout")
    ap.add_argument("--mode", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--library", default=None)
    ap.add_argument("--write", action="store_true", help="calibrate: store the rule (only when it holds)")
    ap.add_argument("--out", type=Path, default=None, help="calibrate: also write the calibration JSON here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        from porter.target import load_target

        target = load_target(args.workspace, args.target, args.source)
        if target.spec.e2e is None:
            raise PorterError(f"target {target.name} declares no [e2e]")
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix=f"porter-e2e-{target.name}-"))
        if args.command == "calibrate":
            return _calibrate(target, args, scratch, t0)
        if args.command == "logprob":
            return _logprob(target, args, scratch, t0)
        if args.command == "build":
            return _build(target, args, scratch, t0)
        if args.command == "prepare":
            from porter.gates.e2e.ds4 import prepare_ds4

            prepare_ds4(target, scratch, args.model)
            print(f"wall time {time.monotonic() - t0:.1f}s")
            return 0
        return _run(target, args, scratch, t0)
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code if hasattr(exc, "exit_code") else 2


def _calibrate(target, args, scratch: Path, t0: float) -> int:
    from porter.gates.e2e import calibration as cal_mod

    if target.spec.e2e.driver == "minimoe":
        from porter.gates.e2e.run_calibration import calibrate_minimoe

        cal = calibrate_minimoe(target, scratch, args.mode, args.model)
    elif target.spec.e2e.driver == "ds4":
        from porter.gates.e2e.ds4 import calibrate_ds4

        cal = calibrate_ds4(target, scratch, args.model, library=args.library)
    else:
        raise PorterError(f"unknown e2e driver {target.spec.e2e.driver!r}")
    print(cal.table())
    if args.out:
        cal_mod.save(cal, args.out)
    if args.write:
        if not cal.calibrated:
            print("porter: error: the calibration does not hold; the rule is not written", file=sys.stderr)
            return 1
        path = target.dir / target.spec.e2e.calibration
        print(f"rule written to {path} (sha256 {cal_mod.save(cal, path)[:12]})")
    print(f"wall time {time.monotonic() - t0:.1f}s")
    return 0 if cal.calibrated else 1


def _run(target, args, scratch: Path, t0: float) -> int:
    from porter.gates.e2e.gate import E2EOptions, run_e2e

    store = True
    if args.library in (None, "scripted"):
        from porter.gates.e2e.minimoe import CudaLibraries

        lib = CudaLibraries(target, scratch).library()
        store = False
    else:
        lib = Path(args.library)
    res = run_e2e(target, args.workspace, lib, options=E2EOptions(scratch=scratch, model=args.model, store=store))
    print(res.summary)
    if res.diagnostics:
        print(res.diagnostics)
    print(f"wall time {time.monotonic() - t0:.1f}s" + ("" if store else " (evidence not stored: scripted library)"))
    return 0 if res.ok else 1


def _logprob(target, args, scratch: Path, t0: float) -> int:
    from porter.gates.e2e.ds4_logprob import run_logprob_vectors

    if not args.model or not args.library:
        raise PorterError("logprob needs --model (the real GGUF) and --library (the workspace's backend)")
    res = run_logprob_vectors(target, args.workspace, Path(args.library), args.model, scratch)
    print(res.summary)
    print(f"wall time {time.monotonic() - t0:.1f}s")
    return 0 if res.ok else 1


def _build(target, args, scratch: Path, t0: float) -> int:
    from porter.gates.e2e.minimoe import Backend, CudaLibraries, MinimoeEngine, plan_variants

    spec = target.spec.e2e
    eng = MinimoeEngine(target, scratch, args.model, n_prompt=spec.prompt_tokens, n_decode=spec.decode_steps)
    cuda = CudaLibraries(target, scratch) if args.mode == "cuda" else None
    plans = plan_variants(target, args.mode, cuda)
    eng.build(Backend("reference"))
    for p in plans:
        print(f"{p.kind:<7} {p.name:<40} {eng.build(p.backend)}")
    print(f"{len(plans)} variants built in {time.monotonic() - t0:.1f}s (nothing run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
