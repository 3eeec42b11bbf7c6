"""The one library builder of calibration: a known-good backend, and the same backend per mutant.

Three sources of known-good code, one interface (`known_good()`, `mutant(m)`):

- SourceLibraries: one CUDA source per unit (the scripted good answers, a folder
  of <unit>.cu): built exactly as the build gate builds (porter.gates.build: same
  flags, forced include, content-addressed object cache, `-z defs` link), so a
  mutant costs one compile and one link.  A unit without a source gets its
  placeholder, as in a fresh workspace.
- UpstreamLibraries: the target's own backend from the user's checkout plus our
  calibration hooks, by the target's [upstream] recipe (target.toml), under
  runs/known-good/<target>/ (never committed); rule mutants are applied to a
  copy of the checkout file at build time.
- a prebuilt known-good library (`--known-good lib.so`): rule mutants are still
  built from the checkout when the target has an upstream recipe.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from porter.gates.mutants import Mutant, scripted_answers
from porter.digest import sha256_bytes
from porter.errors import PorterError
from porter.gates.extract import extract_unit_source
from porter.gates import build as build_gate
from porter.gates import compile_jail
from porter.target.placeholder import placeholder_source

BUILD_TIMEOUT_S = 900


class BuildError(PorterError):
    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def _parallel(fn, items, progress=None, what: str = "") -> list:
    """fn over items, side by side; `progress` (what, total) -> porter.term.Steps shows it moving."""
    from porter.term import Steps

    with (progress or Steps)(what, len(items)) as steps:
        def one(item):
            try:
                return fn(item)
            finally:
                steps.advance()

        with ThreadPoolExecutor(max_workers=max(1, min(len(items) or 1, os.cpu_count() or 1))) as pool:
            return list(pool.map(one, items))


def _caught(fn, *args):
    try:
        return fn(*args)
    except PorterError as exc:
        return exc


# ---------------------------------------------------------------------------
# one source per unit
# ---------------------------------------------------------------------------

class SourceLibraries:
    def __init__(self, target, cache: Path, sources: dict[str, str], describe: str):
        self.target = target
        self.cache = Path(cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.sources = sources
        self.describe = describe
        self.nvcc = build_gate.nvcc_path()

    def object_for(self, name: str, source: str | bytes) -> Path:
        data = source.encode() if isinstance(source, str) else source
        try:
            return build_gate.compile_object(self.target, name, data, self.cache)[0]
        except build_gate.CompileFailure as exc:
            raise BuildError(f"nvcc failed on {name}: {build_gate.first_error(exc.output)}", exc.output) from None

    def library(self, unit_sources: dict[str, str], tag: str = "") -> Path:
        """Compile (cached) and link glue + every unit; returns the library path (content-addressed)."""
        t = self.target
        jobs = [(g.stem, g.read_bytes()) for g in t.glue_sources]
        fails = t.spec.cuda.rules.failure_return
        jobs += [(u, unit_sources.get(u) or placeholder_source(t.api_function(u), t.conventions_header.name, fails))
                 for u in t.units]
        objs = _parallel(lambda j: self.object_for(*j), jobs)
        link_flags = [*t.spec.cuda.link_flags, *build_gate.PORTER_LINK_FLAGS]
        key = sha256_bytes(("\n".join(o.stem for o in objs) + "\0".join(link_flags)).encode())
        lib = self.cache / "lib" / key / t.spec.cuda.library
        if lib.is_file():
            return lib
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.parent / f".{os.getpid()}.{time.monotonic_ns()}.so"
        cmd = [self.nvcc, *link_flags, "-o", str(tmp), *map(str, objs)]
        # the objects are candidate-shaped units (mutants): linked in the compiler's sandbox, as the build gate does
        proc = compile_jail.for_command(cmd, lib.parent).run(cmd, compile_jail.clean_env(), lib.parent,
                                                             build_gate.LINK_TIMEOUT_S, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            log = proc.stderr + proc.stdout
            raise BuildError(f"link of {tag or 'library'} failed: {build_gate.first_error(log)}", log)
        os.replace(tmp, lib)
        return lib

    def known_good(self) -> Path:
        return self.library(self.sources, "known-good")

    def has(self, unit: str) -> bool:
        return unit in self.sources

    def _mutant_source(self, m: Mutant) -> str:
        return m.source if m.source is not None else m.apply(self.sources[m.unit])

    def mutant(self, m: Mutant) -> Path:
        return self.library({**self.sources, m.unit: self._mutant_source(m)}, m.name)

    def prepare(self, mutants: list[Mutant], progress=None) -> None:
        """Compile every mutant's unit up front, in parallel (objects are cached; errors surface at link)."""
        _parallel(lambda m: _caught(self.object_for, m.unit, self._mutant_source(m)), mutants, progress,
                  f"compiling {len(mutants)} mutants")


def sources_from(target, spec: str) -> tuple[dict[str, str], str]:
    """unit -> known-good source for `--known-good scripted` or a folder of <unit>.cu / <unit>.md."""
    if spec == "scripted":
        out = {a["unit"]: extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)
               for a in scripted_answers(target) if a.get("expect") == "pass"}
        if not out:
            raise PorterError(f"target {target.name} has no scripted good answers (scripted/manifest.toml)")
        return out, f"scripted good answers ({target.scripted_dir.relative_to(target.dir)})"
    p = Path(spec).expanduser().resolve()
    out = {}
    for u in target.units if p.is_dir() else []:
        for ext in (".cu", ".md"):
            f = p / f"{u}{ext}"
            if f.is_file():
                out[u] = f.read_text() if ext == ".cu" else extract_unit_source(f.read_text(), u, target)
                break
    if not out:
        raise PorterError(f"--known-good {spec}: not 'scripted', 'upstream', a folder of <unit>.cu/.md or a .so file")
    return out, f"sources in {p}"


# ---------------------------------------------------------------------------
# the target's upstream backend
# ---------------------------------------------------------------------------

def recipe_for(target):
    """The target's [upstream] recipe (target.toml): which checkout files make its backend library."""
    if target.spec.upstream is None:
        raise PorterError(f"target {target.name} declares no [upstream] recipe (how its own backend is built)")
    return target.spec.upstream


def build_upstream(target, mutant: Mutant | None = None, out_dir: Path | None = None,
                   extra_flags: tuple[str, ...] = ()) -> Path:
    """Build the upstream backend (optionally mutated) with our calibration hooks; returns the .so path.
    extra_flags: more nvcc flags (the launch trace links the shared CUDA runtime: -cudart shared)."""
    recipe = recipe_for(target)
    checkout = Path(target.checkout)
    missing = [f for f in (*recipe.sources, *recipe.needs) if not (checkout / f).is_file()]
    if missing:
        raise PorterError(f"source checkout {checkout} lacks {', '.join(missing)}")
    harness = [target.dir / h for h in recipe.harness]
    for h in harness:
        if not h.is_file():
            raise PorterError(f"calibration hook source {h} is missing")
    sources = {f: (checkout / f).read_text() for f in recipe.sources}
    if mutant is not None:
        if mutant.file not in sources:
            raise PorterError(f"mutant {mutant.name}: {mutant.file} is not one of {', '.join(sources)}")
        sources[mutant.file] = mutant.apply(sources[mutant.file])
    nvcc = build_gate.nvcc_path()
    flags = [*target.nvcc_flags, "-shared", *extra_flags]
    h = hashlib.sha256()
    for part in [build_gate.toolchain()["nvcc_version"], " ".join(flags), " ".join(recipe.link_flags)]:
        h.update(str(part).encode() + b"\0")
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    for f in (*recipe.needs, *recipe.harness):
        h.update(f.encode() + b"\0" + (checkout / f if f in recipe.needs else target.dir / f).read_bytes() + b"\0")
    name = mutant.name if mutant else "upstream"
    lib_dir = Path(out_dir or Path(target.workspace) / "runs" / "known-good" / target.name) / name / h.hexdigest()[:16]
    lib = lib_dir / recipe.library
    if lib.is_file():
        return lib
    lib_dir.mkdir(parents=True, exist_ok=True)
    src_paths = []
    for f, text in sources.items():
        if mutant is not None and f == mutant.file:
            p = lib_dir / "src" / f  # the mutated copy; its includes resolve through -I <checkout>
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            src_paths.append(p)
        else:
            src_paths.append(checkout / f)
    tmp = lib_dir / f".{os.getpid()}.{time.monotonic_ns()}.so"
    # the toolkit's library folder as rpath: the parity child dlopens the library, and
    # libcublas must resolve there even when the loader's path does not name the toolkit
    rpath = build_gate.toolkit_rpath(nvcc)
    cmd = [nvcc, *flags, "-I", str(checkout), "-o", str(tmp), *map(str, src_paths), *map(str, harness), *rpath,
           *recipe.link_flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc of {name} ran past {BUILD_TIMEOUT_S} s") from None
    log = proc.stdout + proc.stderr
    (lib_dir / "build.log").write_text(" ".join(cmd) + "\n" + log)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc failed building {name}: {build_gate.first_error(log)}", log)
    os.replace(tmp, lib)
    return lib


class UpstreamLibraries:
    """The checkout's backend (or a prebuilt known-good library) and its rule mutants."""

    def __init__(self, target, out_dir: Path | None = None, prebuilt: Path | None = None):
        self.target, self.out_dir, self.prebuilt = target, out_dir, prebuilt
        self.describe = (f"prebuilt library {prebuilt.name}" if prebuilt
                         else f"upstream {target.name} backend ({target.checkout})")
        self._built: dict[str, Path | Exception] = {}

    def has(self, unit: str) -> bool:
        return True

    def known_good(self) -> Path:
        if self.prebuilt is not None:
            if not self.prebuilt.is_file():
                raise PorterError(f"known-good library {self.prebuilt} does not exist")
            return self.prebuilt
        return self._get(None)

    def mutant(self, m: Mutant) -> Path:
        if m.source is not None:
            raise BuildError(f"mutant {m.name} is a whole {m.unit} file: it cannot be linked into "
                             f"the upstream backend (one translation unit)")
        return self._get(m)

    def _get(self, m: Mutant | None) -> Path:
        key = m.name if m else "upstream"
        if key not in self._built:
            self._built[key] = _caught(build_upstream, self.target, m, self.out_dir)
        got = self._built[key]
        if isinstance(got, Exception):
            raise got
        return got

    def failed(self) -> dict[str, Exception]:
        """The builds so far that failed: name ("upstream" or the mutant's) -> why."""
        return {k: v for k, v in self._built.items() if isinstance(v, Exception)}

    def prepare(self, mutants: list[Mutant], progress=None) -> None:
        """Build the known-good and every rule mutant in parallel (each is a whole-backend compile)."""
        todo = ([] if self.prebuilt else [None]) + [m for m in mutants if m.source is None]
        built = _parallel(lambda m: _caught(build_upstream, self.target, m, self.out_dir), todo, progress,
                          f"building {len(todo)} whole backends (known-good and mutants)")
        for m, got in zip(todo, built):
            self._built[m.name if m else "upstream"] = got


def libraries_for(target, known_good: str, cache: Path, out_dir: Path | None = None):
    """The library builder `--known-good` names: 'scripted', 'upstream', a .so, or a folder of sources."""
    if known_good == "upstream":
        return UpstreamLibraries(target, out_dir)
    p = Path(known_good).expanduser()
    if p.suffix == ".so":
        return UpstreamLibraries(target, out_dir, prebuilt=p.resolve())
    sources, describe = sources_from(target, known_good)
    return SourceLibraries(target, cache, sources, describe)
