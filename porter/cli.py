"""porter's command line: `porter <command> ...` (also `python3 -m porter`).

Commands owned by other modules (status, audit, plan, prompt, report, calibrate) are
imported only when chosen, through their `add_arguments(parser)` and
`run(args) -> int`; a missing one is reported in one line (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from porter.errors import PorterError

EPILOG = """\
examples:
  porter init ~/port-minimoe               a fresh workspace (git repo) with the bundled minimoe target
  cd ~/port-minimoe
  porter units                             the API functions to port, their signatures and file state
  porter plan                              the order units are ported in (prefill path first)
  porter run --provider scripted --max-attempts 6
                                           replay scripted answers through every gate, commit each step
  porter run --provider anthropic --unit mini_gpu_swiglu_tensor
                                           port one unit with a real model
  porter status                            per-unit state, derived from git + ledger + evidence
  porter trust SHA256:...                  pin the ledger signing key you trust (reviewers)
  porter repair --reason "..."             accept a tampered tail or a rollback, recorded and signed
  porter audit mini_gpu_add_tensor         one unit's chain: ledger records, evidence, commits, file
  porter report                            the same for every unit as a static HTML site (runs/report/)

exit codes: 0 ok, 1 a run ended with units failing (or --reverify contradicted a state), 2 bad input,
3 tampered or rolled back (ledger, signatures, evidence, commits, witness), 4 status: a unit is stale.
`porter COMMAND --help` explains each command.
"""

# name -> (module, one-line description); owned by other modules, imported lazily.
DELEGATED = {
    "status": ("porter.commands.status", "per-unit state (unported/failing/built/verified/stale/tampered), derived, never stored"),
    "audit": ("porter.commands.audit", "one unit's chain of evidence: ledger records, evidence hashes, commits, the current file"),
    "plan": ("porter.target.plan", "the order units are ported in: runtime, prefill path, decode path, unreachable"),
    "prompt": ("porter.prompt.cli", "show the prompt porter would send for a unit (nothing is sent)"),
    "report": ("porter.report", "write the reviewer's view as a static HTML site: overview, critical-path graph, a page per unit"),
    "calibrate": ("porter.calibration.command", "check that each parity spec accepts a known-good build and rejects mutants"),
    "trust": ("porter.records.trust", "pin the ledger signing key you trust (a key swapped in the repository is then tampered)"),
    "repair": ("porter.commands.repair", "accept a tampered tail or a rollback explicitly (recorded, signed), so runs can go on"),
    "optimize": ("porter.optimize.command", "ask for faster versions of verified units; keep one only when a "
                 "rank test on interleaved timings proves it faster and every gate passes again"),
    "doctor": ("porter.commands.doctor", "can this machine port this target? nvcc, toolkit headers and libraries, GPU and "
               "architecture, cupy, sandbox, signing key, provider key; one line per check with what to do"),
}
READ_COMMANDS = {"units", "status", "audit", "plan", "prompt", "doctor"}
# commands that append to the ledger or commit: only in a workspace `porter init` made (porter.workspace)
WRITE_COMMANDS = {"run", "optimize", "repair", "calibrate"}
# `porter dev TOOL ...`: each module's main(argv) parses the tool's own options (`python -m MODULE` runs it too)
DEV = {
    "e2e": ("porter.commands.e2e", "the e2e gate by hand: prepare, calibrate (--write stores the rule), run, logprob"),
    "trace": ("porter.calibration.trace", "which known-good kernels each spec's cases launch (GPU; checkout)"),
    "chunks": ("porter.calibration.chunks", "a target's specs in n chunks of equal calibration work (--chunk i/n)"),
    "perf-table": ("porter.calibration.perf_table", "the known-good's time and % of roofline per op in each regime, "
                   "its own perf verdict re-timed, and every perf mutant's (GPU; checkout)"),
    "parity-bench": ("porter.bench.parity", "time from answer text to parity verdict, fresh child vs warm worker (GPU)"),
    "run-bench": ("porter.bench.run", "units per hour of `porter run` at --jobs 1 and N with a slow scripted provider"),
    "status-bench": ("porter.bench.status", "time of `porter status` over a 10,000-record signed ledger"),
    "scan-bench": ("porter.bench.scan", "time of a full and a cached scan of a target's sources"),
}
DEV_LIST = "".join(f"  {name:<14}{help_}\n" for name, (_, help_) in DEV.items())


def porter_version() -> str:
    """The installed distribution's version (pyproject.toml), and the git commit when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("porter")
    except PackageNotFoundError:
        v = "unknown"
    repo = Path(__file__).resolve().parents[1]
    if (repo / ".git").exists():
        from porter.records import gitops

        sha = gitops.commit_of(repo)
        if sha:
            v += f" (commit {sha[:10]})"
    return v


class _Version(argparse.Action):
    """--version, asked for only when given (the commit costs a git process, which no other command pays)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"porter {porter_version()}")
        parser.exit(0)


def _common(json_flag: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--target", metavar="NAME", help="target to work on (default: the workspace's only target)")
    p.add_argument("--source", metavar="DIR", help="the target's source checkout (default: target.toml / PORTER_<T>_SOURCE)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--arch", metavar="SM[,SM]",
                   help="GPU architecture(s) to build for, e.g. sm_120 (default: this machine's GPUs, else the "
                        "target's default_arch; also $PORTER_ARCH)")
    p.add_argument("--require-arch", metavar="SM", action="append",
                   help="a GPU kind every verdict must hold on, beside [cuda] required_archs (repeatable, e.g. "
                        "--require-arch sm_90 --require-arch sm_121; also $PORTER_REQUIRE_ARCH): built for, "
                        "judged on a GPU of that kind, else the unit is not verified")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run candidate code without the sandbox (where bwrap or user namespaces are missing); "
                        "recorded in the evidence, and such units show as 'verified (unsandboxed)'")
    return p


def _chosen_command(argv: list[str]) -> str | None:
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-C":
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    chosen = _chosen_command(list(argv or []))
    parser = argparse.ArgumentParser(
        prog="porter",
        description="porter ports a Metal GPU backend to CUDA one API function (unit) at a time: an LLM writes "
        "each unit, gates (static, build, parity) decide, and every verified step is one git commit with "
        "its ledger record and evidence.",
        epilog=EPILOG + "\ndeveloper tools (`porter dev TOOL --help`):\n" + DEV_LIST,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-C", dest="workspace_dir", metavar="DIR",
                        help="run in workspace DIR (default: the git repository of the current directory)")
    parser.add_argument("--version", action=_Version, nargs=0, help="print porter's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def add(name: str, help_: str, **kw) -> argparse.ArgumentParser:
        parents = [_common(name in READ_COMMANDS)] if name != "init" else []
        return sub.add_parser(name, help=help_, description=help_, parents=parents, conflict_handler="resolve",
                              formatter_class=argparse.RawDescriptionHelpFormatter, **kw)

    p = add("init", "make a new workspace: a git repo with a bundled target and placeholder unit files",
            epilog="example: porter init ~/port-minimoe --target minimoe")
    p.add_argument("directory", metavar="DIR", help="new or empty directory")
    p.add_argument("--target", metavar="NAME|DIR", help="bundled target to copy, or a folder holding a target.toml "
                   "(see docs/adding-a-target.md; default: the bundled example target, minimoe)")
    p.add_argument("--source", metavar="DIR", help="the target's source checkout, for targets without one bundled "
                   "(ds4: a clone of antirez/ds4); its API header gives the placeholders' signatures")

    p = add("run", "port units: prompt, extract, gate, commit each passing step (one run at a time)",
            epilog="examples:\n  porter run --provider scripted --max-attempts 6\n"
                   "  porter run --provider anthropic --unit mini_gpu_add_tensor --time-budget 20m\n\n"
                   "Safe to start from cron: a second run while one is active prints who holds the lock and exits 0;\n"
                   "a run killed at any point is repaired by the next one before it does anything else.")
    p.add_argument("--provider", help="scripted (replays targets/<t>/scripted; the default), anthropic, openai, reference "
                   "(default: $PORTER_PROVIDER, target.toml [provider] name, scripted)")
    p.add_argument("--model", help="model name for the provider (default: the provider's)")
    p.add_argument("--flaws", action="store_true", default=None,
                   help="reference provider: answer each unit with its mutants (targets/<t>/mutants.toml) first, then the real slice")
    p.add_argument("--unit", action="append", metavar="UNIT", help="port only this unit (repeatable; retries exhausted ones)")
    p.add_argument("--max-attempts", type=int, default=3, metavar="N",
                   help="attempts per unit before it is exhausted (default 3); later runs skip an exhausted unit "
                   "until `--unit UNIT` retries it with N more")
    p.add_argument("--max-units", type=int, metavar="N", help="stop after N units")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="units in flight at once, in dependency order (default 1; with --executor ray, "
                   "the cluster's GPUs)")
    p.add_argument("--time-budget", metavar="DURATION", help="stop starting attempts after e.g. 30m, 2h, 90s")
    p.add_argument("--quiet", action="store_true", help="no progress lines (runs/<run>/run.log still has them)")
    from porter.gates.parity.executors import executor_arguments

    executor_arguments(p)
    g = p.add_argument_group("provider settings (override target.toml [provider]; API keys only from the environment)")
    g.add_argument("--base-url", help="server URL (OpenAI-compatible local servers)")
    g.add_argument("--price-input", type=float, metavar="USD", help="USD per million input tokens")
    g.add_argument("--price-output", type=float, metavar="USD", help="USD per million output tokens")
    g.add_argument("--budget-run-usd", type=float, metavar="USD", help="stop the run before it could spend more")
    g.add_argument("--budget-unit-usd", type=float, metavar="USD", help="move past a unit before it could spend more")
    g.add_argument("--budget-run-tokens", type=int, metavar="N")
    g.add_argument("--budget-unit-tokens", type=int, metavar="N")

    p = add("units", "list the target's API functions: signature, runtime/op, file state (placeholder/ported)",
            epilog="example: porter units --target minimoe --json")

    p = sub.add_parser("dev", help="developer tools: " + ", ".join(DEV) + " (listed below)",
                       description="developer tools; `porter dev TOOL --help` gives a tool's options "
                       "(with -C DIR, the tool runs in DIR)", epilog="tools:\n" + DEV_LIST,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tool", choices=DEV, metavar="TOOL")
    p.add_argument("tool_args", nargs=argparse.REMAINDER, metavar="...", help="the tool's own options")

    for name, (module, help_) in DELEGATED.items():
        p = add(name, help_)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_delegate=mod)
    return parser


def _cmd_init(args) -> int:
    from porter.workspace import example_target, init_workspace, is_porter_source, not_made_by_porter, target_folder

    spec = args.target or example_target()
    args.target = target_folder(spec)[0]
    existing = Path(args.directory).expanduser().resolve()
    if is_porter_source(existing):
        raise PorterError(f"{existing} is porter's own source checkout, not a workspace: `porter init` a new or "
                          "empty directory")
    if ((existing / ".git").exists() and (existing / "targets" / args.target / "target.toml").is_file()
            and not_made_by_porter(existing) is None):
        # Re-running a setup script must neither fail nor reset a workspace that holds work: keep it as it is.
        print(f"porter: {existing} is already a workspace with target {args.target}; left as it is "
              f"(`porter -C {existing} status` says where it stands)")
        return 0
    from porter.records import signing

    key = signing.private_key_path()
    had_key = key.is_file()
    ws = init_workspace(args.directory, [spec], source=args.source)
    print(f"porter: new workspace {ws} (target {args.target}, every unit a placeholder)")
    if args.source:
        print(f"source: {Path(args.source).expanduser().resolve()} (remembered in {ws / 'porter.toml'})")
    fp = signing.load_private(ws).fingerprint
    print(f"signing key: {key} ({fp}, {'yours already' if had_key else 'made now'}); its public half is "
          f"committed as ledger/signer.pub")
    print(f"  {signing.SECOND_MACHINE}")
    scripted = (ws / "targets" / args.target / "scripted" / "manifest.toml").is_file()
    provider = "scripted" if scripted else "anthropic"
    print(f"next: cd {ws} && porter units && porter run --provider {provider}")
    return 0


def units_table(workspace: Path, target_name: str, source: str | None) -> list[dict]:
    """Each API function the target ports: its signature, its file, and its state as `porter status`
    derives it (unported, failing, built, verified, ...); `file_state` says only what the file is."""
    from porter.target.placeholder import is_placeholder
    from porter.commands.status import derive
    from porter.target import load_target
    import hashlib

    target = load_target(workspace, target_name, source)
    states = {u.unit: u for u in derive(workspace, target=target, rank=False, prefill=False).units}
    rows = []
    for fn in target.api:
        if fn.name not in target.units:
            continue
        path = target.unit_path(fn.name)
        if path.is_file():
            data = path.read_bytes()
            file_state = "placeholder" if is_placeholder(data.decode("utf-8", "replace")) else "written"
            sha = hashlib.sha256(data).hexdigest()
        else:
            file_state, sha = "missing", None
        rows.append({
            "unit": fn.name,
            "kind": "runtime" if fn.name in target.runtime_units else "op",
            "signature": fn.c_signature(),
            "return_type": fn.return_type,
            "params": [{"type": p.type, "name": p.name} for p in fn.params],
            "header_line": fn.line,
            "file": str(path.relative_to(workspace)),
            "file_state": file_state,
            "state": states[fn.name].state,
            "sha256": sha,
        })
    return rows


def _cmd_units(args) -> int:
    rows = units_table(args.workspace, args.target, args.source)
    if args.json:
        print(json.dumps({"target": args.target, "units": rows}, indent=2))
        return 0
    from rich.text import Text

    from porter.commands.status import STATE_STYLE, counts_line, state_label
    from porter.term import console

    con = console()
    n_rt = sum(r["kind"] == "runtime" for r in rows)
    counts = {s: sum(r["state"] == s for r in rows) for s in STATE_STYLE}
    con.print(f"{args.target}: {len(rows)} units ({n_rt} runtime, {len(rows) - n_rt} ops): {counts_line(counts)}; "
              f"files under {Path(rows[0]['file']).parent}/" if rows else f"{args.target}: no units",
              markup=False, highlight=False)
    w = max((len(state_label(r["state"])) for r in rows), default=0)
    for r in rows:
        con.print(Text.assemble(f"  {r['kind']:<8} ", (f"{state_label(r['state']):<{w}}", STATE_STYLE[r["state"]]),
                                f" {r['signature']}"), soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            return 2
        return _dispatch(args)
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("porter: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _dispatch(args) -> int:
    if args.command == "dev":
        if args.workspace_dir:
            os.chdir(Path(args.workspace_dir).expanduser())
        return int(importlib.import_module(DEV[args.tool][0]).main(args.tool_args) or 0)
    if args.command == "init":
        args.workspace = Path(args.directory).expanduser().resolve()
        return _cmd_init(args)

    from porter.host import sandbox
    from porter.workspace import default_target, find_workspace

    sandbox.allow_unsafe(getattr(args, "unsafe_no_sandbox", False))

    if getattr(args, "arch", None):  # every build of this command, and of its children, is for these
        from porter.host.arch import ENV, normalize

        os.environ[ENV] = ",".join(normalize(a) for a in args.arch.split(",") if a.strip())
    if getattr(args, "require_arch", None):  # validated here: a bad name stops the command in one line
        from porter.host.arch import REQUIRE_ENV, required

        os.environ[REQUIRE_ENV] = ",".join(required(args.require_arch, named=""))
    try:
        args.workspace = find_workspace(args.workspace_dir)
    except PorterError:
        if args.command != "doctor":  # the machine's checks need no workspace
            raise
        args.workspace = None
    if args.command in WRITE_COMMANDS and not (args.command == "calibrate" and (
            getattr(args, "no_ledger", False) or getattr(args, "no_mutants", False) or getattr(args, "mutate", False))):
        from porter.workspace import require_made_by_porter

        # calibrate without ledger records writes nothing there (--mutate: no record; --write one target file)
        require_made_by_porter(args.workspace)
    if args.workspace is not None and not getattr(args, "target", None):
        try:
            args.target = default_target(args.workspace)
        except PorterError:
            if args.command != "doctor":  # doctor says so and checks the machine
                raise
    if args.command == "units":
        return _cmd_units(args)
    if args.command == "run":
        from porter.run import RunOptions, run
        from porter.gates.parity.executors import use_executor

        workers = use_executor(args)
        jobs = args.jobs if args.jobs is not None else (workers or 1)

        keys = ("provider", "model", "base_url", "price_input", "price_output", "budget_run_usd", "budget_unit_usd",
                "budget_run_tokens", "budget_unit_tokens", "flaws")
        return run(RunOptions(args.workspace, args.target, getattr(args, "source", None), list(args.unit or []), args.max_attempts,
                              args.max_units, args.time_budget, args.quiet,
                              {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None},
                              jobs=jobs))
    mod = getattr(args, "_delegate", None)
    if mod is None:
        raise PorterError(f"unknown command {args.command!r}")
    if args.command == "plan":
        _check_target(args)
    rc = mod.run(args)
    return int(rc or 0)


def _check_target(args) -> None:
    """What `porter plan` says of the target before its table: a broken parity spec is one error line (exit 2,
    porter.gates.parity.spec_check), a kernel name no .metal source defines a warning on stderr."""
    from porter.commands.doctor import _kernels
    from porter.gates.parity import spec_check
    from porter.target import load_target

    target = load_target(args.workspace, args.target, getattr(args, "source", None))
    spec_check.require(target)
    for c in _kernels(target):
        print(f"porter: warning: {c.detail} ({c.todo})", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
