"""Which of the known-good's kernels a spec's cases launch: a kernel-launch trace.

    porter dev trace --target ds4 [--unit U ...] [--json FILE]   (GPU, checkout)

A spec is only as strong as the dispatch paths it reaches: upstream ds4 picks
kernels by size thresholds and flags, and a mutant of a path no case reaches
passes.  For every op the upstream function can launch the `__global__`
functions of its slice (porter.target.scan.cuda_slice: the API function and everything
it reaches, plus the slices of the API functions it calls); that is the
reachable set.  The reached set is measured: the upstream backend is built
with the shared CUDA runtime, and an interposer preloaded into the parity
child (LD_PRELOAD) records the name of every kernel launched (nvcc 13's
__cudaLaunchKernel(_ptsz) from <<<>>>, and cudaLaunchKernel) before handing the
call on.  The table says,
per op, reached / reachable and which kernels no case launches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from porter.errors import PorterError

LAUNCH_ENTRY_POINTS = ("cudaLaunchKernel", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz")  # what INTERPOSER_C hooks
TRACE_ENV = "PORTER_LAUNCH_TRACE"  # the file the interposer appends kernel names to (relative: the child's cwd)

INTERPOSER_C = r"""
/* porter's kernel-launch trace: every launch of a library linked with the shared CUDA runtime appends
   the kernel's (mangled) name to $PORTER_LAUNCH_TRACE, then goes on.  nvcc 13's <<<>>> stubs call
   __cudaLaunchKernel(cudaKernel_t, ...) (measured: the first target's upstream backend imports it, not cudaLaunchKernel);
   explicit launches call cudaLaunchKernel(const void *func, ...). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*launch_kernel_fn)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_out;

static void record(const char *name) {
    pthread_mutex_lock(&trace_mu);
    if (!trace_out) {
        const char *path = getenv("PORTER_LAUNCH_TRACE");
        if (path && path[0]) trace_out = fopen(path, "a");
    }
    if (trace_out) { fprintf(trace_out, "%s\n", name ? name : "?"); fflush(trace_out); }
    pthread_mutex_unlock(&trace_mu);
}

typedef CUresult (*kernel_name_fn)(const char **, CUkernel);

static const char *kernel_handle_name(cudaKernel_t kernel) {
    /* the driver's cuKernelGetName, from the libcuda the runtime has already loaded */
    static kernel_name_fn get;
    if (!get) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h) get = (kernel_name_fn)dlsym(h, "cuKernelGetName");
    }
    const char *name = NULL;
    if (!get || get(&name, (CUkernel)kernel) != CUDA_SUCCESS) return NULL;
    return name;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                             cudaStream_t stream) {
    static launch_fn real;
    if (!real) real = (launch_fn)dlsym(RTLD_NEXT, "cudaLaunchKernel");
    if (!real) return cudaErrorUnknown;
    const char *name = NULL;
    if (cudaFuncGetName(&name, func) != cudaSuccess) name = NULL;
    record(name);
    return real(func, grid, block, args, shmem, stream);
}

#define HOOK_KERNEL_LAUNCH(entry)                                                                  \
cudaError_t entry(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shmem,           \
                  cudaStream_t stream) {                                                           \
    static launch_kernel_fn real;                                                                  \
    if (!real) real = (launch_kernel_fn)dlsym(RTLD_NEXT, #entry);                                  \
    if (!real) return cudaErrorUnknown;                                                            \
    record(kernel_handle_name(kernel));                                                            \
    return real(kernel, grid, block, args, shmem, stream);                                         \
}

HOOK_KERNEL_LAUNCH(__cudaLaunchKernel)
HOOK_KERNEL_LAUNCH(__cudaLaunchKernel_ptsz)
"""


def kernel_name(mangled: str) -> str:
    """The kernel's identifier from a mangled (or plain C) name: _ZL12foo_kernelPf -> foo_kernel,
    _Z3barILj8EEvPf -> bar (template arguments dropped: the reachable set names templates once)."""
    m = re.match(r"_Z(?:L)?(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    return mangled[m.end():m.end() + n]


def reachable_kernels(cf, unit: str, rules) -> set[str]:
    """Every kernel a call of `unit` can launch: the __global__ functions of its slice and of the
    slices of the API functions it calls."""
    from porter.target.scan.cuda_slice import path_decls

    kernels = set()
    for d in path_decls(cf, unit, rules):
        if d.kind == "function" and "__global__" in cf.text(d).split("(", 1)[0]:
            kernels.update(d.names)
    return kernels


def trace_row(unit: str, reachable: set[str], reached: set[str], declared: dict[str, str], variants: dict,
              ok: bool, summary: str) -> dict:
    """One op's line of the table: what its cases (and variants) launched against what it can name,
    the spec's declared-unreachable kernels apart from the real gaps."""
    return {"unit": unit, "known_good_ok": ok and all(v["known_good_ok"] for v in variants.values()),
            "reachable": sorted(reachable), "reached": sorted(reached & reachable),
            "missing": sorted(reachable - reached - set(declared)),
            "declared_unreachable": {k: w for k, w in sorted(declared.items()) if k in reachable - reached},
            # a kernel the spec calls unreachable that a case launched: the spec's claim is wrong
            "contradicted": sorted(set(declared) & reached),
            "outside_slice": sorted(reached - reachable), "variants": variants, "summary": summary[:200]}


def read_trace(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {kernel_name(line.strip()) for line in path.read_text(errors="replace").splitlines() if line.strip()}


def build_interposer(out_dir: Path) -> Path:
    """The interposer as a shared library.  Built by nvcc, which knows the toolkit's headers and links
    the shared runtime, so its cudaFuncGetName is the same libcudart the traced library calls."""
    from porter.host.toolchain import nvcc_path, toolkit_rpath

    nvcc = nvcc_path()
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "launch_trace.c"
    src.write_text(INTERPOSER_C)
    lib = out_dir / "liblaunch_trace.so"
    rpath = toolkit_rpath(nvcc)
    cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-o", str(lib), str(src), *rpath,
           "-ldl", "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise PorterError(f"cannot build the launch-trace interposer: {(r.stderr or r.stdout).strip()[:300]}")
    return lib


PARALLEL_SPECS = 6


def trace_units(target, units: list[str], workspace: Path, out=print, parallel: int = PARALLEL_SPECS) -> list[dict]:
    """Run each unit's spec on the upstream backend (shared runtime) with the interposer preloaded.
    Each child appends to a trace file in its own plan folder (its working directory), so several
    specs run at once (their inputs and references are most of the time) and each trace is its own."""
    from concurrent.futures import ThreadPoolExecutor

    from porter.calibration.calibrator import CalibrateOptions, parity_on_library
    from porter.calibration.libraries import build_upstream
    from porter.calibration.variants import VariantPlan
    from porter.gates.parity.gate import fresh_seeds
    from porter.spec import spec_unreachable
    from porter.providers.reference import load_rules, reference_source
    from porter.target.scan.cuda_slice import CudaFile

    rules = load_rules(target)
    cf = CudaFile.parse(reference_source(target), rules)
    scratch = Path(tempfile.mkdtemp(prefix="porter-trace-"))
    interposer = build_interposer(scratch)
    lib = build_upstream(target, out_dir=Path(workspace) / "runs" / "known-good-traced" / target.name,
                         extra_flags=("-cudart", "shared"))
    out(f"traced upstream backend: {lib}")
    plans = scratch / "ws"
    # every child from here on starts with the interposer, in a fresh process, and keeps its plan folder
    # (on a Ray cluster each worker host starts such a fresh child, the interposer sent with the plan)
    ray = os.environ.get("PORTER_PARITY_EXECUTOR") == "ray"
    os.environ.update({"PORTER_PARITY_EXECUTOR": "ray" if ray else "spawn", "LD_PRELOAD": str(interposer),
                       TRACE_ENV: "launch.trace", "PORTER_PARITY_KEEP": "1"})
    opts = CalibrateOptions(plans, ledger=False)
    variant_plan = VariantPlan(target, cf=cf, rules=rules)  # the backend is parsed once, above

    def traced(unit: str, env: dict | None, seeds: list[int]) -> tuple[bool, str, set[str]]:
        before = set((plans / "runs" / "parity").glob(f"{unit}-*"))
        res = parity_on_library(target, unit, lib, opts, env=env, seeds=seeds)
        reached: set[str] = set()
        for d in set((plans / "runs" / "parity").glob(f"{unit}-*")) - before:
            reached |= read_trace(d / "launch.trace")
        return res.ok, res.summary, reached

    def one(unit: str) -> dict:
        seeds = fresh_seeds(2)  # one set per op: its default run and every variant share the prepared cases
        ok, summary, reached = traced(unit, None, seeds)
        reachable = reachable_kernels(cf, unit, rules)
        variants = {}
        for v in variant_plan.for_unit(unit):  # one after another: each reads its own new plan folders
            v_ok, v_summary, v_reached = traced(unit, v.env, seeds)
            variants[v.name] = {"known_good_ok": v_ok, "adds": sorted((v_reached - reached) & reachable),
                                "summary": v_summary[:200]}
            reached |= v_reached
        return trace_row(unit, reachable, reached, spec_unreachable(target, unit), variants, ok, summary)

    rows = []
    try:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            # the ops with the most variants (each a traced run) start first: the longest-first schedule
            # over the slots (with --executor ray, the cluster's GPUs); rows come out in the units' order
            first = sorted(units, key=lambda u: (-len(variant_plan.for_unit(u)), units.index(u)))
            started = {u: pool.submit(one, u) for u in first}
            for row in (started[u].result() for u in units):
                rows.append(row)
                via = [f"{n} +{len(v['adds'])}" for n, v in row["variants"].items()]
                bad = [n for n, v in row["variants"].items() if not v["known_good_ok"]]
                out(f"  {row['unit']}: {len(row['reached'])}/{len(row['reachable'])} kernels reached"
                    + (f" (variants: {', '.join(via)})" if via else "")
                    + (f"; VARIANT REFUSED: {', '.join(bad)}" if bad else "")
                    + (f"; not reached: {', '.join(row['missing'])}" if row["missing"] else "")
                    + (f"; {len(row['declared_unreachable'])} declared unreachable" if row["declared_unreachable"] else "")
                    + (f"; DECLARED UNREACHABLE BUT LAUNCHED: {', '.join(row['contradicted'])}"
                       if row["contradicted"] else "")
                    + ("" if row["known_good_ok"] else f"; KNOWN-GOOD REFUSED: {row['summary'][:120]}"))
    finally:
        os.environ.pop("LD_PRELOAD", None)
    return rows


def main(argv: list[str] | None = None) -> int:
    from porter.calibration.baseline import times_a_case
    from porter.gates import parity
    from porter.gates.parity.executors import executor_arguments, use_executor
    from porter.spec import load_specs
    from porter.target import load_target

    ap = argparse.ArgumentParser(prog="porter dev trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("-C", dest="workspace", default=".")
    ap.add_argument("--target", required=True)
    ap.add_argument("--source", default=None)
    ap.add_argument("--unit", action="append", help="only this unit (repeatable; default: every op spec)")
    ap.add_argument("--chunk", metavar="I/N", help="only the I-th of N parts of those units, balanced by runs")
    ap.add_argument("--json", metavar="FILE", help="write the table as JSON")
    executor_arguments(ap)
    a = ap.parse_args(argv)
    try:
        ws = Path(a.workspace).resolve()
        target = load_target(ws, a.target, a.source)
        workers = use_executor(a)
        ok, why = parity.available()
        if not ok:
            raise PorterError(f"the launch trace runs the parity child on a GPU: {why}")
        specs = load_specs(target)
        units = a.unit or [u for u, s in specs.items() if times_a_case(s)]
        if a.chunk:
            from porter.calibration.chunks import chunk_units

            units = chunk_units(target, a.chunk, units)
        rows = trace_units(target, units, ws, parallel=max(PARALLEL_SPECS, workers or 0))
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code
    full = sum(1 for r in rows if not r["missing"] and not r["contradicted"])
    n_declared = sum(len(r["declared_unreachable"]) for r in rows)
    print(f"\n{full} of {len(rows)} ops launch every kernel their upstream function can reach "
          f"(less those their spec declares unreachable, with why); "
          f"{sum(len(r['reached']) for r in rows)} of {sum(len(r['reachable']) for r in rows)} statically "
          f"reachable kernels reached, {n_declared} declared unreachable, "
          f"{sum(len(r['missing']) for r in rows)} missing")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if full == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
