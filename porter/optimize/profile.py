"""A profile of the committed kernel for the optimisation prompt: Nsight Compute on the spec's timed case.

What the prompt gets, per kernel the unit launches: ncu's duration, achieved DRAM bandwidth (% of
peak), achieved occupancy and SM throughput, medians over the profiled launches.  It is optional
and honest: where ncu is missing, cannot read the GPU's counters (ERR_NVGPUCTRPERM), or reports no
launch of the unit's kernels, the profile is "unavailable (<one-line reason>)" and optimize goes on.
No figure is ever filled in.

The committed code is still candidate code, so the profiled process is a parity child like any
other: the spec's timed case is planned by porter.gates.parity.gate.run_spec, which, once its own
run completed, reruns the plan under ncu in a fresh sandboxed child (runner.run_child, the path
compute-sanitizer takes), with ncu's install folder shown read-only.  Inside the sandbox the
candidate could write ncu's report file too, so what is read from it is bounded and narrow:
numbers, and kernel names only where they are the committed file's own __global__ functions; an
error says one of a few fixed reasons, never the report's text.  The figures inform the prompt,
never a verdict.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

# ncu metric -> the field it fills (names as Nsight Compute documents them)
METRICS = {
    "gpu__time_duration.sum": "duration_us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
}
REPORT = "ncu.csv"  # in the profiled plan's folder
MAX_LAUNCHES = 64  # profiled launches: each is replayed once per counter pass
REPORT_MAX_BYTES = 4 << 20
PCT_MAX = 1000.0  # a percentage past this is not ncu's honest writing: dropped, not clamped
NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute*/ncu")
_TIME_UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                  "second": 1e6, "s": 1e6}
# what a report without rows may say, and the one line the prompt then carries (never the report's text)
KNOWN_ERRORS = (
    ("ERR_NVGPUCTRPERM", "ERR_NVGPUCTRPERM: no permission to read the GPU's performance counters "
                         "(ncu ran inside the sandbox)"),
    ("ERR_NVGPUCTRBUSY", "ERR_NVGPUCTRBUSY: the GPU's counters are held by another profiler"),
    ("No kernels were profiled", "ncu profiled no launch of the unit's kernels"),
)


@dataclass(frozen=True)
class KernelProfile:
    kernel: str
    launches: int
    duration_us: float | None = None
    dram_pct: float | None = None
    occupancy_pct: float | None = None
    sm_pct: float | None = None


@dataclass(frozen=True)
class Profile:
    kernels: tuple[KernelProfile, ...] = ()
    case: str | None = None
    unavailable: str | None = None  # one line: why there are no figures

    @classmethod
    def missing(cls, why: str) -> "Profile":
        return cls(unavailable=" ".join(str(why).split())[:200] or "no reason given")

    def line(self) -> str:
        if self.unavailable or not self.kernels:
            return f"profile: unavailable ({self.unavailable or 'no kernel rows'})"
        return "profile: " + ", ".join(f"{k.kernel} {_f(k.dram_pct)}% DRAM" for k in self.kernels)

    def render(self) -> str:
        """The prompt's compact table, or the one line that says why there is none."""
        if self.unavailable or not self.kernels:
            return self.line()
        rows = ["Profile of the committed code (Nsight Compute" + (f", case {self.case!r}" if self.case else "")
                + "; medians over the profiled launches, each replayed by ncu with caches flushed):",
                "",
                "| kernel | launches | duration (us) | DRAM throughput (% of peak) | achieved occupancy (%) "
                "| SM throughput (% of peak) |",
                "| --- | --- | --- | --- | --- | --- |"]
        rows += [f"| {k.kernel} | {k.launches} | {_f(k.duration_us)} | {_f(k.dram_pct)} | {_f(k.occupancy_pct)} "
                 f"| {_f(k.sm_pct)} |" for k in self.kernels]
        return "\n".join(rows)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


# -- reading the committed source and ncu's report --------------------------------------------------

_GLOBAL = re.compile(r"__global__\b([^;{]*)")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*\(")


def kernel_names(source: str) -> list[str]:
    """The __global__ functions the unit's file defines (or declares), in order: what ncu profiles."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    out: list[str] = []
    for m in _GLOBAL.finditer(text):
        head = _LAUNCH_BOUNDS.sub(" ", m.group(1))
        name = _NAME_BEFORE_PAREN.search(head)
        if name and name.group(1) not in out:
            out.append(name.group(1))
    return out


def base_name(kernel: str) -> str:
    """'void ns::add_kernel<256>(float *, ...)' -> 'add_kernel': the function name ncu's rows carry."""
    head = kernel.split("(", 1)[0].split("<", 1)[0].strip()
    return head.split()[-1].split("::")[-1] if head else ""


def number(text: str) -> float | None:
    """ncu's value text ('1,234.5', 'n/a') as a finite float, or None."""
    try:
        v = float(str(text).replace(",", "").strip())
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _value(field_name: str, raw: str, unit: str) -> float | None:
    v = number(raw)
    if v is None or v < 0:
        return None
    if field_name == "duration_us":
        scale = _TIME_UNITS_US.get(unit.strip())
        return v * scale if scale is not None and v > 0 else None
    return v if v <= PCT_MAX else None


def parse_report(text: str, kernels: list[str]) -> list[KernelProfile]:
    """ncu's CSV (`--csv --page raw`: one column per metric and a units row; or the details page: one
    row per metric) -> a KernelProfile per kernel of `kernels` that has rows, in `kernels`' order.
    Lines before the header (==PROF== lines, the child's own output) are skipped; rows of other
    kernels (the harness's) are dropped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        return []
    rows = [r for r in csv.reader(lines[start:]) if r]
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        return []
    samples: dict[str, dict[str, dict[str, float]]] = {}  # kernel -> launch ID -> field -> value

    def put(row: list[str], metric: str, raw: str, unit: str) -> None:
        name = base_name(row[col["Kernel Name"]])
        field_name = METRICS.get(metric)
        if name not in kernels or field_name is None:
            return
        v = _value(field_name, raw, unit)
        if v is not None:
            samples.setdefault(name, {}).setdefault(row[col.get("ID", 0)], {})[field_name] = v

    if "Metric Name" in col:  # the details page: one row per (launch, metric)
        need = max(col["Metric Name"], col.get("Metric Value", 0), col.get("Metric Unit", 0))
        for row in body:
            if len(row) > need:
                put(row, row[col["Metric Name"]], row[col.get("Metric Value", -1)],
                    row[col["Metric Unit"]] if "Metric Unit" in col else "")
    else:  # the raw page: a units row (no ID), then one row per launch
        units = next((r for r in body if len(r) == len(header) and not r[col.get("ID", 0)].strip()), None)
        for row in body:
            if len(row) != len(header) or row is units:
                continue
            for metric in METRICS:
                if metric in col:
                    put(row, metric, row[col[metric]], units[col[metric]] if units else "")
    out = []
    for name in kernels:
        launches = samples.get(name)
        if not launches:
            continue
        fields = {f: [v[f] for v in launches.values() if f in v] for f in METRICS.values()}
        out.append(KernelProfile(name, len(launches), **{f: (median(vs) if vs else None) for f, vs in fields.items()}))
    return out


def why_no_rows(text: str, outcome=None) -> str:
    """One fixed line for a report without rows of the unit's kernels."""
    for marker, why in KNOWN_ERRORS:
        if marker in text:
            return why
    if outcome is not None and outcome.status != "done":
        return f"the profiled run ended as {outcome.status!r}"
    return "ncu reported no launch of the unit's kernels"


# -- running it ------------------------------------------------------------------------------------

def find_ncu() -> Path | None:
    """The Nsight Compute binary to run in the sandbox: ncu on PATH when it is the program itself, else
    the newest install under /opt/nvidia/nsight-compute/ (or a CUDA toolkit's copy).  The CUDA
    toolkit's bin/ncu is a shell launcher that looks for an install at run time in folders the sandbox
    does not show, so the install it would pick is named here and its folder is what the sandbox shows."""
    found = shutil.which("ncu")
    if found and not _is_launcher_script(Path(found)):
        return Path(found)
    for pattern in NCU_GLOBS:
        hits = sorted(glob.glob(pattern), key=_version_key)
        if hits:
            return Path(hits[-1])
    return Path(found) if found else None


def _is_launcher_script(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def _version_key(path: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", path)]


def _read_bounded(path: Path) -> str:
    try:
        if not path.is_file() or path.is_symlink():
            return ""
        with open(path, "rb") as f:
            return f.read(REPORT_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class NcuExecutor:
    """run_spec's `profile_with`: the plan rerun as `ncu ... python child.py PLAN` in a fresh parity
    sandbox (runner.run_child), ncu's install folder read-only.  Serves one plan; keeps its outcome and
    the report text it read back (after run_child scrubbed the folder of links)."""

    ncu: Path
    kernels: list[str]
    outcome: object | None = None
    report: str = ""
    tool_ro: list[str] = field(default_factory=list)

    def argv(self, plan_dir: Path) -> list[str]:
        from porter.gates.parity import runner

        return [str(self.ncu), "--csv", "--page", "raw", "--metrics", ",".join(METRICS),
                "--kernel-name-base", "function", "--kernel-name", "regex:^(" + "|".join(self.kernels) + ")$",
                "--launch-count", str(MAX_LAUNCHES), "--log-file", str(Path(plan_dir) / REPORT)
                ] + runner.child_argv(Path(plan_dir))

    def run(self, plan_dir: Path, timeout: float):
        from porter.gates.parity import runner

        ro = self.tool_ro or [str(Path(self.ncu).resolve().parent)]
        self.outcome = runner.run_child(Path(plan_dir), timeout, argv=self.argv(plan_dir), tool_ro=ro)
        # the report file, and stdout where an ncu without --log-file support printed it
        self.report = _read_bounded(Path(plan_dir) / REPORT) + "\n" + _read_bounded(Path(plan_dir) / "child.stdout")
        return self.outcome


def profile_committed(target, workspace: Path, unit: str, case: str | None = None) -> Profile:
    """The committed `unit` profiled on its spec's timed case (`case`: the label perf timed; default:
    the last timed case).  Never raises: a failure is the reason the profile is unavailable."""
    try:
        return _profile(target, Path(workspace), unit, case)
    except Exception as exc:  # noqa: BLE001 - a profile is optional; its failure must not stop optimize
        return Profile.missing(f"profiling failed: {type(exc).__name__}")


def _profile(target, ws: Path, unit: str, case: str | None) -> Profile:
    from porter.records import gitops
    from porter.spec import SpecError, UnitSpec, load_spec

    ncu = find_ncu()
    if ncu is None:
        return Profile.missing("ncu (Nsight Compute) not found on PATH or in /opt/nvidia/nsight-compute/")
    if os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower() == "ray":
        return Profile.missing("parity runs on a Ray cluster; ncu profiles on this machine's GPU only")
    rel = str(target.unit_path(unit).relative_to(ws))
    blob = gitops.committed_blob(ws, rel)
    if blob is None:
        return Profile.missing(f"{rel} is not committed")
    kernels = kernel_names(blob.decode("utf-8", "replace"))
    if not kernels:
        return Profile.missing("the committed file defines no __global__ kernel to profile")
    try:
        spec = load_spec(target, unit)
    except SpecError:
        return Profile.missing("the unit's parity spec does not load")
    timed = [s for s in getattr(spec, "shapes", []) if s.timed] if isinstance(spec, UnitSpec) else []
    if not timed:
        return Profile.missing("the unit has no timed parity case")
    shape = next((s for s in timed if s.label == case), timed[-1])
    return _run_under_ncu(target, ws, unit, dataclasses.replace(spec, shapes=[shape]), ncu, kernels, shape.label)


def _run_under_ncu(target, ws: Path, unit: str, spec, ncu: Path, kernels: list[str], label: str) -> Profile:
    from porter.gates.driver import Candidate, GateContext
    from porter.gates.parity.gate import run_spec
    from porter.optimize.ab import committed_library

    ctx = GateContext(target, ws)
    old, lib, why = committed_library(Candidate.of(unit, ""), ctx)
    if lib is None:
        return Profile.missing("the committed code does not build here" if old is not None else why)
    ex = NcuExecutor(ncu, kernels)
    res = run_spec(target, spec, lib, workspace=ws, timing_reps=0, mode=ctx.parity.mode, timeout=ctx.parity.timeout,
                   env=ctx.parity.env, regime=ctx.parity.regime, fresh_process=True, candidate_sha256=old.sha256,
                   profile_with=ex)
    if ex.outcome is None:
        word = "was skipped" if res.skipped else "failed" if not res.ok else "did not complete"
        return Profile.missing(f"the committed code's parity run {word}: nothing to profile")
    found = parse_report(ex.report, kernels)
    if not found:
        return Profile.missing(why_no_rows(ex.report + "\n" + ex.outcome.stderr_tail, ex.outcome))
    return Profile(tuple(found), label)
