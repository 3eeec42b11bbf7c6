"""Benchmark: time from a candidate's answer text to its parity verdict (GPU machine).

    porter dev parity-bench [--unit U] [--reps N] [--scratch-reps M] [--json FILE]
                            [--paths spawn,warm] [--sandbox on|off|both] [--isolation] [--workers N] [--build-only]

A throw-away workspace holds minimoe with every unit ported (the scripted good
answers).  Each measured attempt takes the unit's answer text with a fresh
nonce in its code (so the unit really recompiles) through what the loop does:
extract -> static gate -> build gate (this unit compiled alone, everything else
linked from cached objects) -> parity gate.  "scratch" does the same with an
empty build cache: the whole backend is compiled before the link.

--paths: "spawn" starts a sandboxed child when the plan arrives, "warm" hands
it to a pre-started sandboxed worker (pool.py); both on the same machine in one
run.  --sandbox both: each path also without the sandbox, in the same run.
--isolation then sends a crashing, a hanging and an
illegal-address candidate (the adversarial corpus) between good ones through
the warm pool: each must be refused by its check, and the good ones stay fast.
--workers N: the throughput of N warm workers (one per GPU) on one queue of
candidates, against one worker (prebuilt libraries, parity only).
--build-only (no GPU): candidate text -> build verdict alone, with the host
compile's precompiled prefix (porter/gates/host_pch.py) on and off, and on
without the compiler's sandbox, in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from porter.host import sandbox
from porter.calibration.libraries import sources_from
from porter.gates.mutants import scripted_answers
from porter.gates.extract import extract_unit_source
from porter.gates import parity
from porter.gates.driver import Candidate, GateContext, ParityOptions, refusal, run_gates
from porter.gates.parity import executors
from porter.target import load_target
from porter.workspace import example_target
from porter.term import command_steps

REPO = Path(__file__).resolve().parents[2]


def _workspace(repo: Path, tmp: Path, name: str) -> Path:
    ws = tmp / "ws"
    shutil.copytree(repo / "targets" / name, ws / "targets" / name,
                    ignore=shutil.ignore_patterns("ported", "__pycache__"))
    fx = load_target(repo, name).fixture_path
    if fx is not None and fx.is_file():
        (ws / "runs" / "fixtures").mkdir(parents=True)
        shutil.copy(fx, ws / "runs" / "fixtures" / fx.name)
    return ws


def _pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def attempt(target, unit: str, text: str, cache: Path, workspace: Path, timeout: float | None = None,
            source: str | None = None, gates: tuple[str, ...] = ("static", "build", "parity")) -> dict:
    """Candidate text -> verdict through the one gate driver, with each stage's time."""
    t0 = time.monotonic()
    cand = Candidate.of(unit, source if source is not None else extract_unit_source(text, unit, target))
    t = {"extract": time.monotonic() - t0}
    stamps = [time.monotonic()]
    ctx = GateContext(target, workspace, build_cache=cache, parity=ParityOptions(timeout=timeout))
    results = run_gates(cand, ctx, gates=gates,
                        on_result=lambda r: stamps.append(time.monotonic()))
    by = {r.gate: r for r in results}
    for k, r in enumerate(results):
        t[r.gate] = stamps[k + 1] - stamps[k]
    refused = refusal(results)
    if refused is not None and refused.gate != "parity":
        raise SystemExit(f"{refused.gate} gate refused the benchmark candidate: {refused.summary}\n{refused.diagnostics}")
    b, p = by["build"], by.get("parity", by["build"])
    t.update(total=time.monotonic() - t0, ok=p.ok, parity_summary=p.summary, check=p.check,
             compile_s=b.evidence.get("compile_seconds"), others_s=b.evidence.get("others_compile_seconds"),
             link_s=b.evidence.get("link_seconds"), parity_child_s=p.evidence.get("child", {}).get("elapsed_s"),
             parity_prepare_s=(p.evidence.get("harness_s") or {}).get("prepare_s"),
             child_phase_s=p.evidence.get("child", {}).get("phase_s") or {},
             compile_steps_ms=b.evidence.get("compile_steps_ms") or {})
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev parity-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", default="mini_gpu_matmul_q8_0_tensor")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--scratch-reps", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--paths", default="spawn,warm", help="comma list of spawn, warm, ray (default spawn,warm; "
                    "ray: the warm workers of the Ray cluster at --ray-address)")
    ap.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster of the 'ray' path (default: a Ray on this machine)")
    ap.add_argument("--isolation", action="store_true", help="bad candidates between good ones (warm path)")
    ap.add_argument("--workers", type=int, default=0, metavar="N", help="also: N workers vs 1 on one queue")
    ap.add_argument("--nvcc-phases", action="store_true", help="also: nvcc's phase times for the unit, with and "
                    "without the conventions header, and with host -O0")
    ap.add_argument("--build-only", action="store_true", help="no GPU needed: candidate text -> build verdict, "
                    "with the host compile's precompiled prefix on and off, alternating")
    ap.add_argument("--sandbox", choices=("on", "off", "both"), default="on",
                    help="candidate code in the sandbox (on), without it (off: --unsafe-no-sandbox), or each path "
                    "both ways in turn: what the sandbox costs a verdict")
    a = ap.parse_args(argv)
    if a.ray_address:
        os.environ["PORTER_RAY_ADDRESS"] = a.ray_address

    ok, why = parity.available()
    if not ok and not a.build_only:
        print(f"bench: parity unavailable: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="porter-bench-"))
    name = example_target()
    ws = _workspace(REPO, tmp, name)
    target = load_target(ws, name)
    good, _ = sources_from(target, "scripted")
    target.ported_dir.mkdir(parents=True, exist_ok=True)
    for u, src in good.items():
        target.unit_path(u).write_text(src)
    answer = next(x for x in scripted_answers(target) if x["unit"] == a.unit and x["expect"] == "pass")
    text = (target.scripted_dir / answer["file"]).read_text()

    def with_nonce(i: int) -> str:
        return text.replace('#include "mini_cuda.cuh"', f'#include "mini_cuda.cuh"\n// bench nonce {time.time_ns()}-{i}', 1)

    def summary(rows):
        tot = [r["total"] for r in rows]
        return {"n": len(rows), "median_s": statistics.median(tot), "p90_s": _pct(tot, 0.9),
                "stages_median_s": {k: statistics.median(r[k] for r in rows)
                                    for k in ("extract", "static", "build", "parity")},
                "split_median_s": {k: statistics.median((r[k] or 0.0) for r in rows)
                                   for k in ("compile_s", "link_s", "parity_prepare_s", "parity_child_s")},
                "child_phase_median_s": {k: round(v, 4) for k, v in _key_medians(rows, "child_phase_s").items()},
                # the compile's steps: device and host chains run side by side, then final
                "compile_steps_median_ms": _key_medians(rows, "compile_steps_ms"),
                "all_ok": all(r["ok"] for r in rows)}

    def show(name, x):
        print(f"  {name}: median {x['median_s']:.2f} s, p90 {x['p90_s']:.2f} s over {x['n']} (stages: " +
              ", ".join(f"{k} {v:.2f}" for k, v in x["stages_median_s"].items()) + "; split: " +
              ", ".join(f"{k} {v:.2f}" for k, v in x["split_median_s"].items()) + f"), all ok={x['all_ok']}")
        if x["child_phase_median_s"]:
            print("    parity child: " + ", ".join(f"{k} {v:.3f}" for k, v in x["child_phase_median_s"].items()))
        _show_steps(x["compile_steps_median_ms"])

    if a.build_only:
        res = build_only(target, a.unit, with_nonce, tmp, ws, a.reps)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    warm = tmp / "cache-warm"
    t0 = time.monotonic()
    first = attempt(target, a.unit, with_nonce(-1), warm, ws)  # fills the object cache (and cupy's kernel cache)
    print(f"warm-up (cold cache, whole backend compiled): {time.monotonic() - t0:.1f} s, parity ok={first['ok']}")
    res: dict = {"unit": a.unit, "cold_first_s": first["total"], "paths": {}, "rows": {}}
    print(f"unit {a.unit}: candidate text -> parity verdict (unit compiled alone + link from cached objects)")
    res["sandbox"] = sandbox.version()
    for path in [x.strip() for x in a.paths.split(",") if x.strip()]:
        for unsafe in {"on": [False], "off": [True], "both": [False, True]}[a.sandbox]:
            os.environ["PORTER_PARITY_EXECUTOR"] = path
            os.environ.pop(sandbox.UNSAFE_ENV, None)
            if unsafe:
                os.environ[sandbox.UNSAFE_ENV] = "1"
            name = path + (" (no sandbox)" if unsafe else "")
            executors.shutdown()
            attempt(target, a.unit, with_nonce(-2), warm, ws)  # starts the pool outside the measurement
            with command_steps(f"{name}: verdicts", a.reps) as steps:
                rows = []
                for i in range(a.reps):
                    rows.append(attempt(target, a.unit, with_nonce(100 * len(res["paths"]) + i), warm, ws))
                    steps.advance()
            res["paths"][name], res["rows"][name] = summary(rows), rows
            show(f"{name:<5}", res["paths"][name])
    os.environ.pop(sandbox.UNSAFE_ENV, None)
    with command_steps("scratch: whole backend per verdict", a.scratch_reps) as steps:
        scratch = []
        for i in range(a.scratch_reps):
            scratch.append(attempt(target, a.unit, with_nonce(1000 + i), tmp / f"cache-scratch-{i}", ws))
            steps.advance()
    if scratch:
        res["scratch"] = summary(scratch)
        show("scratch (whole backend compiled, empty cache)", res["scratch"])
    if "warm" in res["paths"]:
        w = res["paths"]["warm"]
        met = w["median_s"] < 1.5 and w["p90_s"] < 2.0
        print(f"  target warm median < 1.5 s and p90 < 2 s: {'met' if met else 'NOT met'}")
    if a.nvcc_phases:
        res["nvcc_phases"] = nvcc_phases(target, extract_unit_source(text, a.unit, target), tmp)
    if a.isolation:
        res["isolation"] = isolation(target, a.unit, with_nonce, warm, ws)
    if a.workers:
        res["workers"] = throughput(target, a.unit, text, warm, ws, a.workers)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def build_only(target, unit, with_nonce, tmp: Path, ws: Path, reps: int) -> dict:
    """Candidate text -> build verdict (extract, static, build; no GPU), with the host compile's
    precompiled prefix (build.HOST_PCH) on, off, and on without the compiler's sandbox in turn,
    from one warm object cache."""
    from porter.gates import build

    cache = tmp / "cache-build"
    t0 = time.monotonic()
    attempt(target, unit, with_nonce(-1), cache, ws, gates=("static", "build"))  # whole backend + the header
    print(f"warm-up (cold cache, whole backend compiled): {time.monotonic() - t0:.1f} s")
    rows: dict[str, list[dict]] = {"host-pch": [], "no-host-pch": [], "unsandboxed": []}
    with command_steps(f"build verdicts, {len(rows)} modes each", reps) as steps:
        for i in range(reps):
            for k, mode in enumerate(rows):
                build.HOST_PCH = mode != "no-host-pch"
                # the compiler's sandbox (compile_jail.py) off: what its bwrap starts cost
                os.environ[sandbox.UNSAFE_ENV] = "1" if mode == "unsandboxed" else ""
                rows[mode].append(attempt(target, unit, with_nonce(7000 + 3 * i + k), cache, ws,
                                          gates=("static", "build")))
            steps.advance()
    build.HOST_PCH = True
    os.environ.pop(sandbox.UNSAFE_ENV)
    out = {"unit": unit, "reps": reps, "modes": {}}
    print(f"unit {unit}: candidate text -> build verdict (unit compiled alone + link from cached objects)")
    for mode, rs in rows.items():
        tot, comp = [r["total"] for r in rs], [r["compile_s"] for r in rs]
        out["modes"][mode] = {"median_s": statistics.median(tot), "p90_s": _pct(tot, 0.9),
                              "compile_median_s": statistics.median(comp), "all_ok": all(r["ok"] for r in rs),
                              "rows": rs}
        print(f"  {mode:<12} median {statistics.median(tot):.2f} s, p90 {_pct(tot, 0.9):.2f} s over {len(rs)} "
              f"(compile median {statistics.median(comp):.2f} s), all ok={all(r['ok'] for r in rs)}")
        out["modes"][mode]["compile_steps_median_ms"] = steps = _key_medians(rs, "compile_steps_ms")
        _show_steps(steps)
    return out


def _key_medians(rows: list[dict], field: str) -> dict[str, float]:
    """Per key of the rows' `field` dicts, the median over the rows (0 where a row lacks the key)."""
    return {k: statistics.median(r[field].get(k, 0.0) for r in rows)
            for k in sorted({k for r in rows for k in r[field]})}


def _show_steps(steps: dict[str, float]) -> None:
    if steps:
        print("    compile steps (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()))


def nvcc_phases(target, source: str, tmp: Path) -> dict:
    """nvcc --time for the unit as the build gate compiles it, and two variants: where the time goes."""
    import csv
    import subprocess

    from porter.gates.build import compile_flags, nvcc_path

    d = tmp / "nvcc-phases"
    d.mkdir(exist_ok=True)
    (d / "unit.cu").write_text(source)
    (d / "empty.cu").write_text("// nothing\n")
    flags = compile_flags(target)
    no_header = [f for i, f in enumerate(flags) if f != "-include" and (i == 0 or flags[i - 1] != "-include")]
    variants = {"unit (as the build gate)": ("unit.cu", flags),
                "unit, host -O0": ("unit.cu", flags + ["-Xcompiler", "-O0"]),
                "empty file + conventions header": ("empty.cu", flags),
                "empty file, no header": ("empty.cu", no_header)}
    out = {}
    print("nvcc phases (ms):")
    for name, (src, fl) in variants.items():
        csv_path = d / f"{len(out)}.csv"
        t0 = time.monotonic()
        subprocess.run([nvcc_path(), "-c", *fl, "--time", str(csv_path), "-o", str(d / "x.o"), src], cwd=d,
                       capture_output=True, check=False)
        wall = time.monotonic() - t0
        try:
            rows = list(csv.reader(csv_path.open()))[1:]
            phases = {r[1].strip(): float(r[-2]) for r in rows if len(r) > 2 and r[-2].strip()}
        except (OSError, ValueError, IndexError):
            phases = {}
        out[name] = {"wall_s": wall, "phases_ms": phases}
        print(f"  {name:<34} {wall:.2f} s: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    return out


ISOLATION = [("good", None, None), ("crash", "add_host_segfault.cu", "mini_gpu_add_tensor"), ("good", None, None),
             ("timeout", "swiglu_hang.cu", "mini_gpu_swiglu_tensor"), ("good", None, None),
             ("cuda-error", "add_illegal_address.cu", "mini_gpu_add_tensor"), ("good", None, None)]


def isolation(target, unit, with_nonce, cache, ws) -> list[dict]:
    """Bad candidates between good ones through the warm pool: each refused by its check."""
    os.environ["PORTER_PARITY_EXECUTOR"] = "warm"
    adv = target.dir / "adversarial"
    rows = []
    print("isolation (warm path; parity time limit 10 s):")
    for i, (want, file, bad_unit) in enumerate(ISOLATION):
        if file is None:
            r = attempt(target, unit, with_nonce(5000 + i), cache, ws, timeout=10)
            good = r["ok"]
        else:
            r = attempt(target, bad_unit, "", cache, ws, timeout=10, source=(adv / file).read_text())
            good = (not r["ok"]) and r["check"] == want
        rows.append(dict(r, want=want, as_expected=good))
        print(f"  {want:<10} {'ok ' if good else 'BAD'} total {r['total']:.2f} s (parity {r['parity']:.2f} s): "
              f"{r['parity_summary'][:110]}")
    goods = [r["total"] for r in rows if r["want"] == "good"]
    print(f"  good ones: median {statistics.median(goods):.2f} s, max {max(goods):.2f} s; "
          f"all as expected: {all(r['as_expected'] for r in rows)}")
    return rows


def throughput(target, unit, text, cache, ws, n_workers: int, n_jobs: int = 24) -> dict:
    """Parity verdicts per second of one queue of candidates (libraries prebuilt) on 1 worker vs N."""
    from concurrent.futures import ThreadPoolExecutor

    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    cand = Candidate.of(unit, extract_unit_source(text, unit, target))
    ctx = GateContext(target, ws, build_cache=cache)
    built = run_gates(cand, ctx, gates=("build",))[-1]
    lib = Path(ctx.library)
    spec = load_spec(target, unit)
    out = {}
    for n in (1, n_workers):
        os.environ["PORTER_PARITY_EXECUTOR"] = "warm"
        os.environ["PORTER_PARITY_WORKERS"] = str(n)
        executors.shutdown()
        run_spec(target, spec, lib, workspace=ws)  # start the workers
        t0 = time.monotonic()
        with ThreadPoolExecutor(n) as ex:
            oks = list(ex.map(lambda _: run_spec(target, spec, lib, workspace=ws).ok, range(n_jobs)))
        dt = time.monotonic() - t0
        out[n] = {"seconds": dt, "verdicts_per_s": n_jobs / dt, "all_ok": all(oks)}
        print(f"  {n} worker(s): {n_jobs} parity verdicts in {dt:.1f} s = {n_jobs / dt:.2f}/s, all ok={all(oks)}")
    os.environ.pop("PORTER_PARITY_WORKERS", None)
    del built
    return out


if __name__ == "__main__":
    sys.exit(main())
