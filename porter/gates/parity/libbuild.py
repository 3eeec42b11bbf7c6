"""Backend libraries for calibration: glue + one CUDA source per unit.

The loop's build gate builds the workspace's library from its unit files;
calibration needs libraries made of other sources (the known-good answers, and
per adversarial mutant the known-good set with one unit swapped).  They are
built exactly as the build gate builds (porter.gates.build: the same flags,
forced include, content-addressed object cache and `-z defs` link), so a
mutant costs one compile and one link.  A unit without a source gets its
placeholder, as in a fresh workspace.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from porter.errors import PorterError
from porter.gates import build as build_gate
from porter.placeholder import placeholder_source


class BuildError(PorterError):
    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class LibBuilder:
    def __init__(self, target, cache: Path):
        self.target = target
        self.cache = Path(cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.nvcc = build_gate.nvcc_path()

    def object_for(self, name: str, source: str | bytes) -> Path:
        data = source.encode() if isinstance(source, str) else source
        try:
            return build_gate.compile_object(self.target, name, data, self.cache)[0]
        except build_gate.CompileFailure as exc:
            raise BuildError(f"nvcc failed on {name}: {build_gate.first_error(exc.output)}", exc.output) from None

    def sources(self, unit_sources: dict[str, str]) -> list[tuple[str, str, bytes]]:
        jobs = [(f"glue:{g.name}", g.stem, g.read_bytes()) for g in self.target.glue_sources]
        for u in self.target.units:
            src = unit_sources.get(u)
            if src is None:
                src = placeholder_source(self.target.api_function(u), self.target.conventions_header.name)
            jobs.append((u, u, src.encode() if isinstance(src, str) else src))
        return jobs

    def library(self, unit_sources: dict[str, str], tag: str = "") -> Path:
        """Compile (cached) and link glue + every unit; returns the library path (content-addressed)."""
        jobs = self.sources(unit_sources)
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            objs = list(pool.map(lambda j: self.object_for(j[1], j[2]), jobs))
        link_flags = [*self.target.spec.cuda.link_flags, *build_gate.PORTER_LINK_FLAGS]
        key = hashlib.sha256(("\n".join(o.stem for o in objs) + "\0".join(link_flags)).encode()).hexdigest()
        lib = self.cache / "lib" / key / self.target.spec.cuda.library
        if lib.is_file():
            return lib
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.parent / f".{os.getpid()}.{time.monotonic_ns()}.so"
        proc = subprocess.run([self.nvcc, *link_flags, "-o", str(tmp), *map(str, objs)], capture_output=True,
                              text=True, timeout=build_gate.LINK_TIMEOUT_S)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"link of {tag or 'library'} failed: {build_gate.first_error(proc.stderr + proc.stdout)}",
                             proc.stderr + proc.stdout)
        os.replace(tmp, lib)
        return lib
