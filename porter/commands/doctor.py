"""`porter doctor`: can this machine port this target?  One line per check, with what to do.

It runs anywhere: outside a workspace (or in one of several targets, without --target) it checks the
machine (nvcc, GPU, cupy, sandbox) and says, in a `note` line, what only a workspace's target lets it
check.

    checks(workspace, target_name, source, provider) -> list[Check]
    preflight(workspace, target, provider, command)   the required checks; EnvironmentFault on the first failing

A required check failing means every answer asked for would be wasted (no
compiler, a header the target's conventions include missing from the toolkit,
no sandbox, a signed ledger without its key, no API key): `porter doctor`
exits 2, and `porter run` / `porter calibrate` run the same checks before any
answer is asked for and stop with one line.  The others say what this machine
cannot do (no GPU: units end as 'built', not 'verified') and how to get it.
A secret is never printed: the provider's key is reported as present or not.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from porter.host import arch as gpu_arch
from porter.host import sandbox
from porter.errors import EnvironmentFault, PorterError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    todo: str = ""  # what to do when not ok
    required: bool = True  # a failure stops run / calibrate
    note: bool = False  # neither passing nor failing: what doctor could not check here, and why

    def line(self) -> str:
        mark = "note" if self.note else "ok  " if self.ok else ("FAIL" if self.required else "warn")
        text = f"{mark} {self.name:<13} {self.detail}"
        return text + (f" -> {self.todo}" if self.todo and not self.ok else "")


# -- the toolkit -----------------------------------------------------------------------------------

def _nvcc() -> tuple[Check, str | None]:
    from porter.host.toolchain import find_nvcc, nvcc_release_line

    exe = find_nvcc()
    if exe is None:
        return Check("nvcc", False, "not on PATH, $CUDA_HOME, $CUDA_PATH or $CONDA_PREFIX",
                     "install the CUDA toolkit and add its bin/ to PATH (export PATH=/usr/local/cuda/bin:$PATH)"), None
    try:
        return Check("nvcc", True, f"{nvcc_release_line(exe)} ({exe})"), exe
    except PorterError as exc:
        return Check("nvcc", False, str(exc), "reinstall the CUDA toolkit"), None


def include_dirs(nvcc: str) -> list[Path]:
    """Where the compile finds `#include <...>` (porter.host.toolchain.locate: the same folders its sandbox shows)."""
    from porter.host.toolchain import toolkit

    return list(toolkit(nvcc).include_dirs)


def library_dirs(nvcc: str) -> list[Path]:
    from porter.host.toolchain import toolkit

    return list(toolkit(nvcc).lib_dirs)


def linked_libraries(target) -> list[str]:
    """The libraries the target's backend and its upstream build link (`-lcublas` -> "cublas")."""
    flags = list(target.spec.cuda.link_flags) + list(target.spec.upstream.link_flags if target.spec.upstream else [])
    return list(dict.fromkeys(f[2:] for f in flags if f.startswith("-l") and len(f) > 2))


def _toolkit_packages(nvcc: str) -> str:
    """The Debian/Ubuntu package names of the toolkit's math libraries for this nvcc's release."""
    from porter.host.toolchain import nvcc_release_line

    m = re.search(r"release (\d+)\.(\d+)", nvcc_release_line(nvcc))
    v = f"{m.group(1)}-{m.group(2)}" if m else "<major>-<minor>"
    return (f"apt-get install cuda-libraries-dev-{v} (or libcublas-dev-{v}), the full toolkit, or NVIDIA's "
            f"wheel (pip install nvidia-cublas-cu{m.group(1) if m else '<major>'})")


def _toolkit_files(target, nvcc: str) -> list[Check]:
    """The target's toolkit headers and linked libraries, looked for where the sandboxed compile looks
    (porter.host.toolchain.locate): found here means the compiler sees it."""
    from porter.host.toolchain import toolkit

    tk = toolkit(nvcc)
    out = []
    extra = [str(d) for d in (*tk.extra_include, *tk.extra_lib)]
    if extra or tk.notes:
        out.append(Check("toolkit", True, f"{tk.root}" + (f", and {', '.join(dict.fromkeys(extra))}" if extra else "")
                         + (f"; {'; '.join(tk.notes)}" if tk.notes else ""), required=False))
    headers = list(target.spec.cuda.toolkit_headers)
    found = {h: tk.header(h) for h in headers}
    missing = [h for h, p in found.items() if p is None]
    if headers:
        out.append(Check("headers", not missing,
                         f"{', '.join(f'{h} ({p.parent})' for h, p in found.items())} found" if not missing else
                         f"{', '.join(missing)} not in the toolkit or beside it "
                         f"({', '.join(str(d) for d in tk.include_dirs[:2])})",
                         f"{_toolkit_packages(nvcc)}: the target's conventions include them"))
    libs = linked_libraries(target)
    where = {lib: tk.library(lib) for lib in libs}
    gone = [lib for lib, p in where.items() if p is None]
    if libs:
        versioned = {lib: tk.library_versions(lib) for lib in gone}
        only = [f"{v[0]} (no lib{lib}.so beside it for -l{lib}: ln -s {v[0].name} {v[0].parent}/lib{lib}.so)"
                for lib, v in versioned.items() if v]
        out.append(Check("libraries", not gone,
                         f"{', '.join('lib' + x for x in libs)} found" if not gone else
                         f"{', '.join('lib' + x + '.so' for x in gone)} not found (target links "
                         f"{' '.join('-l' + x for x in libs)})" + (f"; only {', '.join(only)}" if only else ""),
                         f"{_toolkit_packages(nvcc)}: the backend links them"))
    return out


# -- the GPU ---------------------------------------------------------------------------------------

def _gpu(target) -> list[Check]:
    from porter.host.toolchain import driver_facts

    found = gpu_arch.detected()
    drv = driver_facts() or _cupy_driver()
    out = []
    if found:
        gpu = drv.get("gpu") or "GPU"
        out.append(Check("gpu", True, f"{gpu} ({', '.join(found)}), driver {drv.get('driver') or '?'}"))
    else:
        out.append(Check("gpu", False, "none found (cupy and nvidia-smi see no GPU)",
                         "parity and perf need an NVIDIA GPU: units here end as 'built', never 'verified'",
                         required=False))
    choice = target.arch if target is not None else None
    if choice is not None:
        # under --executor ray the cluster's workers load the builds (porter.gates.parity.executors names their
        # architectures), not this machine's GPUs
        remote = os.environ.get("PORTER_PARITY_EXECUTOR") == "ray"
        uncovered = [] if remote else [a for a in found if a not in choice.archs]
        out.append(Check("arch", not uncovered, f"builds for {choice.describe()}",
                         f"this machine's {', '.join(uncovered)} would not load those builds: add it to --arch "
                         f"(e.g. --arch {','.join([*choice.archs, *uncovered])}) or drop --arch"))
    return out


def _cupy_driver() -> dict:
    """{"gpu", "driver"} as cupy sees them, where nvidia-smi is not on PATH (a container)."""
    try:
        import cupy

        rt = cupy.cuda.runtime
        name = rt.getDeviceProperties(0).get("name", b"GPU")
        v = rt.driverGetVersion()
        return {"gpu": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                "driver": f"CUDA {v // 1000}.{v % 1000 // 10} (cupy)"}
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return {}


def _cupy(nvcc_line: str | None) -> Check:
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - not installed, or built for another CUDA
        return Check("cupy", False, f"not importable ({type(exc).__name__})",
                     "pip install -e '.[gpu]' (cupy-cuda13x; '.[gpu-cuda12]' for a CUDA 12 toolkit): parity needs it",
                     required=False)
    try:
        runtime = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as exc:  # noqa: BLE001 - no driver
        return Check("cupy", False, f"{cupy.__version__}, its CUDA runtime does not start ({type(exc).__name__})",
                     "check the NVIDIA driver (nvidia-smi)", required=False)
    major = runtime // 1000
    m = re.search(r"release (\d+)", nvcc_line or "")
    ok = m is None or int(m.group(1)) == major
    return Check("cupy", ok, f"{cupy.__version__} on CUDA {major}.{runtime % 1000 // 10}"
                 + ("" if m is None else f", nvcc is CUDA {m.group(1)}"),
                 f"the backend built by nvcc {m.group(1) if m else '?'} loads next to cupy's CUDA {major} runtime "
                 f"(two runtimes in the parity child): pip install cupy-cuda{m.group(1) if m else ''}x, or put "
                 f"the matching nvcc on PATH", required=False)


# -- trust: sandbox, signing key, witness, provider key ---------------------------------------------

def _sandbox() -> Check:
    if sandbox.unsafe():
        return Check("sandbox", False, "off (--unsafe-no-sandbox): candidate code runs unconfined",
                     "install bubblewrap and drop --unsafe-no-sandbox", required=False)
    ok, why = sandbox.available()
    return Check("sandbox", ok, f"bubblewrap works ({why})" if ok else why,
                 f"{sandbox.INSTALL_HINT} and enable unprivileged user namespaces (or pass --unsafe-no-sandbox)")


def _signing(workspace: Path) -> list[Check]:
    from porter.records.signing import load_workspace_key, private_key_path, signer_for
    from porter.records.witness import witness_dir

    public, problem = load_workspace_key(workspace)
    if problem is None and public is None:
        key = Check("signing key", True, "the ledger is unsigned (an old workspace): nothing to sign with")
    else:
        try:
            signer = signer_for(workspace)
            key = Check("signing key", True, f"{signer.fingerprint} ({private_key_path()})")
        except PorterError as exc:
            key = Check("signing key", False, str(exc),
                        "copy the signing key to this machine's PORTER_HOME (or set PORTER_SIGNING_KEY); "
                        "a reviewer only reads: `porter status`")
    wdir = witness_dir()
    probe = wdir if wdir.exists() else next((p for p in wdir.parents if p.exists()), Path("/"))
    writable = os.access(probe, os.W_OK)
    witness = Check("witness", writable, f"{wdir}" + ("" if wdir.exists() else " (made at the first step)"),
                    "make it writable or set PORTER_WITNESS_DIR: rollbacks of the ledger are seen through it",
                    required=False)
    return [key, witness]


def _provider(target, options: dict) -> Check:
    from porter.providers import KNOWN, provider_name

    name = provider_name(target, options)
    module = KNOWN.get(name)
    if module is None:
        return Check("provider", True, f"{name} (a plugin: its own checks)")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return Check("provider", False, f"{name}: {module} cannot be imported ({exc})", "pip install -e .")
    envs = next((c.key_envs for c in vars(mod).values() if isinstance(c, type) and getattr(c, "key_envs", ())), ())
    if name == "reference":
        src = target.checkout / target.spec.reference.source if target.spec.reference else None
        return Check("provider", bool(src and src.is_file()),
                     f"reference: {src}" if src else "reference: the target declares no [reference] backend",
                     "give --source a checkout holding the target's own CUDA backend")
    if not envs:
        return Check("provider", True, f"{name} (no key needed)")
    have = [e for e in envs if os.environ.get(e)]
    local = name == "openai" and (options.get("base_url") or (target.spec.provider or {}).get("base_url"))
    return Check("provider", bool(have or local),
                 f"{name}: key in ${have[0]} (not shown)" if have else
                 f"{name}: local server, no key needed" if local else f"{name}: no {' or '.join('$' + e for e in envs)}",
                 f"export {envs[0]}=... (keys come from the environment only)")


# -- the target ------------------------------------------------------------------------------------

# what only a workspace's target lets doctor check
TARGET_CHECKS = "the target's toolkit headers and libraries, its build architecture, the signing key and the provider key"


def _target(workspace: Path | None, name: str | None, source: str | None):
    from porter.target import load_target

    if workspace is None:
        return Check("workspace", True, f"no workspace here: this machine's checks only; inside a workspace (or "
                     f"with -C DIR) doctor also checks {TARGET_CHECKS}", note=True), None
    if name is None:
        names = sorted(p.parent.name for p in (workspace / "targets").glob("*/target.toml"))
        return Check("target", True, f"targets/ holds {len(names)} targets ({', '.join(names)}): pass --target NAME "
                     f"to check one ({TARGET_CHECKS}); this machine's checks follow", note=True), None
    try:
        target = load_target(workspace, name, source)
    except PorterError as exc:
        return Check("target", False, str(exc), "pass --source DIR (the engine's checkout) or set "
                     f"PORTER_{(name or 'T').upper()}_SOURCE"), None
    return Check("target", True, f"{target.name}: checkout {target.checkout}, {len(target.units)} units"), target


def checks(workspace: Path | None, target_name: str | None, source: str | None = None,
           provider: dict | None = None, names: tuple[str, ...] | None = None) -> list[Check]:
    """Every check, in the order a user fixes them; `names`: only these (the preflight's)."""
    want = (lambda n: names is None or n in names)  # noqa: E731
    out: list[Check] = []
    tcheck, target = _target(workspace, target_name, source)
    if want(tcheck.name):
        out.append(tcheck)
    nvcc_check, nvcc = _nvcc()
    if want("nvcc"):
        out.append(nvcc_check)
    if nvcc and target is not None:
        out += [c for c in _toolkit_files(target, nvcc) if want(c.name)]
    if want("gpu") or want("arch"):
        out += [c for c in _gpu(target) if want(c.name)]
    if want("cupy"):
        out.append(_cupy(nvcc_check.detail if nvcc else None))
    if want("sandbox"):
        out.append(_sandbox())
    if workspace is not None and (want("signing key") or want("witness")):
        from porter.workspace import is_porter_source

        if not is_porter_source(workspace):  # porter's checkout holds no ledger of anyone's
            out += [c for c in _signing(workspace) if want(c.name)]
    if target is not None and want("provider"):
        out.append(_provider(target, provider or {}))
    if target is not None and names is None:  # the preflight checks specs apart (preflight below)
        out += _specs(target)
        out += _kernels(target)
        out += _cpu_backend(target)
    return out


def _specs(target) -> list[Check]:
    """Every parity spec built on the CPU (porter.gates.parity.spec_check): one line per broken spec and case."""
    from porter.gates.parity import spec_check

    say = (lambda text: print(f"porter: {text}", file=sys.stderr, flush=True)) if sys.stderr.isatty() else None
    rep = spec_check.check(target, progress=say)
    fix = f"fix it in this workspace's copy, targets/{target.name}/parity/ (porter init copied the target)"
    out = [Check("parity spec", False, p.line(), fix) for p in rep.problems]
    if not rep.problems:
        out.append(Check("parity specs", True, rep.summary()))
    if rep.without_spec:
        runtime = [u for u in rep.without_spec if u in target.runtime_units]
        out.append(Check("parity specs", False, f"{len(rep.without_spec)} unit(s) without a spec "
                         f"({', '.join(rep.without_spec[:4])}{' ...' if len(rep.without_spec) > 4 else ''}): they end "
                         "'built', never 'verified'",
                         "write targets/<t>/parity/<unit>.py: SPEC = UnitSpec(...) for an op"
                         + (", SCENARIO = Scenario(...) for a runtime unit" if runtime else ""), required=False))
    return out


def _kernels(target) -> list[Check]:
    """Kernel names the Metal host dispatches that no .metal source defines (a misspelling, or a kernel the
    scan cannot see): its unit's prompt lacks that kernel's source."""
    from porter.target.scan import scan

    try:
        unknown = scan(target).unknown_kernels
    except PorterError as exc:
        return [Check("kernels", False, f"the scan failed: {exc}", "see `porter plan`", required=False)]
    bad = {u: ks for u, ks in unknown.items() if ks}
    if not bad:
        return []
    shown = "; ".join(f"{u}: {', '.join(ks)}" for u, ks in list(bad.items())[:3])
    return [Check("kernels", False, f"names the Metal host dispatches that no .metal source defines: {shown}"
                  + (f" (+{len(bad) - 3} units)" if len(bad) > 3 else ""),
                  "check the spelling in the Metal host, or add the .metal file to [source] metal_sources",
                  required=False)]


def _cpu_backend(target) -> list[Check]:
    """[source] cpu_backend: the CPU implementation of the same API, compiled against the API header (a file
    that does not match the header is no implementation of it)."""
    import subprocess
    import shutil

    path = target.cpu_backend
    if path is None:
        return []
    if not path.is_file():
        return [Check("cpu backend", False, f"{path} ([source] cpu_backend) does not exist in the checkout",
                      "fix [source] cpu_backend in target.toml, or remove it")]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return [Check("cpu backend", True, f"{path.name}: not compiled (no cc here)", note=True)]
    r = subprocess.run([cc, "-fsyntax-only", "-std=c11", "-I", str(target.api_header.parent), str(path)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:200])
        return [Check("cpu backend", False, f"{path.name} does not compile against {target.api_header.name}: {first}",
                      "[source] cpu_backend names the CPU implementation of the API header", required=False)]
    return [Check("cpu backend", True, f"{path.name} compiles against {target.api_header.name}")]


# what stops each command before it asks for anything; `porter run` checks the signing key (exit 3) and
# the provider's key (when it makes the provider) itself, right after
PREFLIGHT = {
    "run": ("target", "nvcc", "headers", "libraries", "arch", "sandbox"),
    "calibrate": ("target", "nvcc", "headers", "libraries", "arch", "sandbox"),
    "optimize": ("target", "nvcc", "headers", "libraries", "arch", "sandbox"),
}


def preflight(workspace: Path, target, command: str, provider: dict | None = None) -> None:
    """The required checks of `command`: EnvironmentFault (exit 2, one line) on the first that fails; then, for
    a run, every parity spec built on the CPU (a broken spec: one line naming its file, case and problem)."""
    for c in checks(workspace, target.name, str(target.checkout), provider, PREFLIGHT[command]):
        if c.required and not c.ok:
            raise EnvironmentFault(f"{c.name}: {c.detail}; {c.todo} (`porter doctor` lists every check)")
    if command in SPEC_CHECKED:
        from porter.gates.parity import spec_check

        spec_check.require(target)


# commands that check the target's specs before asking for an answer (calibrate reports a broken spec itself)
SPEC_CHECKED = ("run", "optimize")


# -- the command -----------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("--provider", help="the provider whose key to check (default: as `porter run` picks it)")
    p.add_argument("--base-url", help="an OpenAI-compatible local server (no key needed)")
    p.epilog = "examples:\n  porter doctor\n  porter doctor --source ~/src/engine --provider anthropic --json\n  porter doctor --arch sm_120"


def run(args) -> int:
    options = {k: v for k, v in (("provider", args.provider), ("base_url", args.base_url)) if v}
    found = checks(args.workspace, args.target, getattr(args, "source", None), options)
    failing = [c for c in found if c.required and not c.ok]
    if getattr(args, "json", False):
        json.dump({"ok": not failing, "checks": [asdict(c) for c in found]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for c in found:
            print(c.line())
        partial = next((c for c in found if c.note and c.name in ("workspace", "target")), None)
        print(f"{len(failing)} required check(s) failing: porter run would stop before asking for an answer"
              if failing else "ready: every required check passes" if partial is None else
              "this machine: every required check it could make passes; the target's were not made (see the note)")
    return 2 if failing else 0
