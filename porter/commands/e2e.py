"""porter dev e2e {calibrate,run,<driver command>} --target NAME ...   (also `python3 -m porter.commands.e2e`)

  calibrate  run every backend of targets/NAME/e2e/variants.toml through the target's driver
             (--mode cpu: the CPU rows where the driver has them; cuda: all rows), print the
             table, and with --write store the rule where target.toml's [e2e] calibration names it
  run        the gate itself: --library PATH (the workspace's backend), or --library scripted
             (build porter's CUDA backend from the scripted good answers; evidence is then
             not stored, since that library is not the workspace's tree)
  other      the commands the target's e2e driver adds (its COMMANDS; listed by --help with --target)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from porter.errors import PorterError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev e2e", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", help="calibrate, run, or a command of the target's driver")
    ap.add_argument("--target", required=True)
    ap.add_argument("--workspace", type=Path, default=Path("."))
    ap.add_argument("--source", default=None, help="the target's source checkout")
    ap.add_argument("--mode", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--scratch", type=Path, default=None,
                    help="where fixtures and builds go (kept); default: a temporary folder removed at the end "
                    "(a real-width fixture alone can be many GB)")
    ap.add_argument("--keep-scratch", action="store_true", help="keep the temporary scratch folder and say where")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--library", default=None)
    ap.add_argument("--write", action="store_true", help="calibrate: store the rule (only when it holds)")
    ap.add_argument("--out", type=Path, default=None, help="calibrate: also write the calibration JSON here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    made = None  # a scratch folder this command made: removed when it ends, unless --keep-scratch
    try:
        from porter.gates.e2e.target_driver import commands, load_driver
        from porter.target import load_target

        target = load_target(args.workspace, args.target, args.source)
        driver = load_driver(target)
        scratch = args.scratch or (made := Path(tempfile.mkdtemp(prefix=f"porter-e2e-{target.name}-")))
        extra = commands(driver)
        if args.command == "calibrate":
            return _calibrate(driver, target, args, scratch, t0)
        if args.command == "run":
            return _run(target, args, scratch, t0)
        if args.command not in extra:
            raise PorterError(f"unknown command {args.command!r} for target {target.name} (calibrate, run"
                              + "".join(f", {c}" for c in extra) + ")")
        rc = extra[args.command][1](target, args, scratch)
        print(f"wall time {time.monotonic() - t0:.1f}s")
        return rc
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code if hasattr(exc, "exit_code") else 2
    finally:
        if made is not None and args.keep_scratch:
            print(f"scratch kept: {made}", file=sys.stderr)
        elif made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _calibrate(driver, target, args, scratch: Path, t0: float) -> int:
    from porter.gates.e2e import calibration as cal_mod

    cal = driver.calibrate(target, scratch, mode=args.mode, model=args.model, library=args.library)
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
        from porter.calibration.libraries import SourceLibraries, sources_from

        sources, origin = sources_from(target, "scripted")
        lib = SourceLibraries(target, scratch / "cuda-cache", sources, origin).library(sources, tag="scripted")
        store = False
    else:
        lib = Path(args.library)
    res = run_e2e(target, args.workspace, lib, options=E2EOptions(scratch=scratch, model=args.model, store=store))
    print(res.summary)
    if res.diagnostics:
        print(res.diagnostics)
    print(f"wall time {time.monotonic() - t0:.1f}s" + ("" if store else " (evidence not stored: scripted library)"))
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
