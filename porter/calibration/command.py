"""`porter calibrate`: does every parity spec accept known-good code and reject its mutants?

    porter calibrate --target minimoe                      # known-good = the scripted good answers
    porter calibrate --target minimoe --known-good DIR     # DIR/<unit>.cu or DIR/<unit>.md
    porter calibrate --target ds4 --known-good upstream    # the checkout's own backend, and mutants.toml
    porter calibrate --target ds4 --known-good lib.so      # a prebuilt known-good (mutants built from the checkout)
    porter calibrate --target minimoe --mutate             # generated mutants: what the specs miss (mutate/)

Every mutant of the calibrated units runs (the adversarial corpus, scripted bad
answers, mutants.toml rules) unless --mutant names some or --no-mutants skips
them; without its mutants a spec is not recorded as calibrated.  The known-good
runs on --seed-sets fresh seed sets per spec (seed_sweep.py): refused on any one,
the spec is not calibrated; the margin table shows each spec's worst error as a
fraction of its tolerance.  Exit 0 when everything behaved, 1 otherwise, 2 when
it cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from porter.calibration import seed_sweep, sweep_record
from porter.calibration.calibrator import CalibrateOptions, calibrate, inputs_table, matrix, table
from porter.calibration.chunks import chunk_units
from porter.calibration.libraries import libraries_for
from porter.calibration.mutate import command as mutate
from porter.errors import PorterError
from porter.target.gguf_file import check_model_file
from porter.gates import parity
from porter.gates.driver import ParityOptions
from porter.gates.parity import executors
from porter.gates.parity.executors import executor_arguments, use_executor
from porter.spec import MODEL_ENV, load_specs
from porter.target import load_target


def parse_seeds(text: str) -> list[int]:
    """'00000000000004d2,0000000000000403' (hex, as evidence and the seed sweep's record write seeds) ->
    [1234, 1027]: one seed per pass of a seed set, so two."""
    parts = [p.strip() for p in text.split(",")]
    try:
        seeds = [int(p, 16) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not hex seeds (e.g. 00000000000004d2,0000000000000403)") \
            from None
    if len(seeds) != 2 or any(s < 0 or s >= 2**64 for s in seeds):
        raise argparse.ArgumentTypeError(f"a seed set is two 64-bit hex seeds, one per pass; got {text!r}")
    return seeds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--known-good", default="scripted", metavar="SRC",
                   help="'scripted' (the target's scripted good answers, default), 'upstream' (the target's upstream "
                   "backend built from its checkout), a DIR of <unit>.cu/.md, or a .so")
    p.add_argument("--unit", action="append", metavar="UNIT", help="only this unit's spec (repeatable)")
    p.add_argument("--chunk", metavar="I/N", help="only the I-th of N parts of the specs (of --unit's, if given), "
                   "balanced by parity runs: a calibration split over runs with a time limit")
    p.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant (repeatable)")
    p.add_argument("--no-mutants", action="store_true",
                   help="known-good only: nothing is recorded (a spec is calibrated only with its mutants)")
    p.add_argument("--no-variants", dest="variants", action="store_false",
                   help="skip the known-good's env-knob variants (targets/<t>/known_good_variants.toml)")
    p.add_argument("--sanitize", action="store_true", help="also run each case under compute-sanitizer memcheck")
    p.add_argument("--seed-sets", type=int, default=seed_sweep.DEFAULT_SETS, metavar="K",
                   help=f"run each spec's known-good on K fresh seed sets (default {seed_sweep.DEFAULT_SETS}; "
                        f"{seed_sweep.ESCALATE_FACTOR}K on a spec whose worst error passes "
                        f"{seed_sweep.ESCALATE_ABOVE:g} of its tolerance): a spec it fails on any set is not "
                        "calibrated; 1 = one run")
    p.add_argument("--seeds", metavar="HEX,HEX", type=parse_seeds, default=None,
                   help="the known-good's first seed set (and its mutants') on these seeds, as a refused set's "
                        "record names them (the margin table, --json): with --seed-sets 1 --no-mutants it "
                        "reproduces that set")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="parity runs in flight at once, over all specs (default: min(4, CPUs)); "
                        "each GPU still runs one at a time")
    p.add_argument("--per-gpu", type=int, default=None, metavar="K",
                   help="K warm parity workers share each GPU (default 1; also $PORTER_PARITY_WORKERS_PER_GPU): "
                        "for --mutate and the seed sweep, whose runs are judged by values; every timing that "
                        "decides a verdict (the known-good's baseline, a perf re-time) is then taken by a fresh "
                        "child holding the GPU alone. Give --jobs at least K per GPU")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="time limit per parity child (default 120)")
    p.add_argument("--timing-reps", type=int, default=10, metavar="N", help="CUDA-event timing repetitions")
    p.add_argument("--build-dir", metavar="DIR", help="object/library cache (default runs/build-cache)")
    p.add_argument("--out-dir", metavar="DIR", help="upstream libraries (default runs/known-good/<target>)")
    p.add_argument("--no-ledger", action="store_true", help="do not append calibration records to the ledger")
    p.add_argument("--no-static", dest="static", action="store_false",
                   help="do not show the static gate's verdict on each mutant")
    p.add_argument("--report", metavar="FILE", help="write the full report as JSON to FILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--model", metavar="GGUF", help="the user's model: spec shapes with a 'model:' source read its "
                   "tensors by name (default: $PORTER_PARITY_MODEL, else synthetic tensors of the census types)")
    p.add_argument("--mode", choices=("cuda", "host"), default="cuda", help=argparse.SUPPRESS)
    executor_arguments(p)
    mutate.add_arguments(p)


def apply_per_gpu(args) -> None:
    """--per-gpu K for this process and the parity executor it makes (read once, when it is made)."""
    k = getattr(args, "per_gpu", None)
    if k is None:
        return
    if k < 1:
        raise PorterError(f"--per-gpu must be at least 1, not {k}")
    os.environ[executors.PER_GPU_ENV] = str(k)


def run(args) -> int:
    apply_per_gpu(args)
    if getattr(args, "mutate", False):
        return mutate.run(args)
    stray = mutate.stray_options(args)
    if stray:
        raise PorterError(f"{', '.join(stray)}: only with --mutate")
    ws = Path(args.workspace)
    if getattr(args, "model", None):  # read by porter.spec.Context.for_target
        os.environ[MODEL_ENV] = str(check_model_file(args.model).resolve())
    target = load_target(ws, args.target, getattr(args, "source", None))
    workers = use_executor(args, args.mode)
    if args.mode == "cuda":
        from porter.commands.doctor import preflight

        preflight(ws, target, "calibrate")  # a machine that cannot build or load the libraries: one line, exit 2
        ok, why = parity.available()
        if not ok:
            raise PorterError(f"calibrate needs the parity gate to run: {why}")
    cache = Path(args.build_dir) if args.build_dir else ws / "runs" / "build-cache"
    libs = libraries_for(target, args.known_good, cache, Path(args.out_dir) if args.out_dir else None)
    units = args.unit
    if getattr(args, "chunk", None):
        units = chunk_units(target, args.chunk, units)
        if not units:
            raise PorterError(f"chunk {args.chunk} holds no spec (fewer specs than chunks)")
    opts = CalibrateOptions(ws, units, args.mutant, not args.no_mutants,
                            ParityOptions(mode=args.mode, sanitize=args.sanitize, timeout=args.timeout,
                                          timing_reps=args.timing_reps, seeds=getattr(args, "seeds", None)),
                            show_static=args.static, ledger=not args.no_ledger and not args.no_mutants,
                            variants=getattr(args, "variants", True),
                            seed_sets=getattr(args, "seed_sets", seed_sweep.DEFAULT_SETS))
    if opts.seed_sets < 1:
        raise PorterError(f"--seed-sets must be at least 1, not {opts.seed_sets}")
    if getattr(args, "jobs", None):
        if args.jobs < 1:
            raise PorterError(f"--jobs must be at least 1, not {args.jobs}")
        opts.jobs = args.jobs
    elif workers:
        opts.jobs = workers  # one unit per cluster worker: its runs keep that worker busy
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    from porter.term import console, steps_factory

    # a bar on a terminal (on stderr beside --json), a line every tenth of each job in a log
    opts.progress = steps_factory(console(file=sys.stderr if args.json else None), plain=log)
    report = calibrate(target, libs, opts, out=log)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    specs_now = {u: s.sha256 for u, s in load_specs(target).items()}
    if getattr(args, "write", False):
        path, written = sweep_record.write(target, report, specs_now)
        log(f"seed sweep: {len(written)} spec(s) recorded in {path}" if written else
            "seed sweep: nothing recorded (--write keeps sweeps of 2 or more seed sets)")
    bad = [r for r in report["rows"] if not r["ok"]]
    if args.json:
        report["mutation"] = mutate.recorded_scores(target, report)
        print(json.dumps(report, indent=1, default=str))
    else:
        from porter.term import width

        cols = width()
        print(f"\n{table(report, cols)}\n\n{matrix(report, target.symbol_prefix, cols)}")
        margins = seed_sweep.margin_table(report, target.symbol_prefix, cols)  # the known-good's worst per spec
        if margins:
            print(f"\n{margins}")
        inputs = inputs_table(report, target.symbol_prefix, cols)
        if inputs:
            print(f"\n{inputs}")
        recorded = sweep_record.line(target, specs_now)
        if recorded:
            print(f"\n{recorded}")
        scores = mutate.recorded_table(target, report, cols)
        if scores:
            print(f"\n{scores}")
        print(f"\n{len(report['rows']) - len(bad)} of {len(report['rows'])} behaved as they must"
              + (f"; {len(bad)} did not" if bad else "") + f" ({report['seconds']} s)")
    return 1 if bad else 0
