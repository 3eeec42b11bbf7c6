"""The scanner: what the engine needs, read from its sources before any code is written.

`scan(target)` reads the target's checkout and returns a ScanResult:

- metal:  kernels, template instantiations (host name -> template + args),
          function constants, top-level symbols for source slices (porter.target.scan.metal)
- host:   per API function, the dispatch sites and kernels behind them, with
          bindings and grid sizes; UNRESOLVED names with reasons (porter.target.scan.host)
- engine: the call graph of the engine sources and what prefill/decode reach
          (porter.target.scan.engine), extended by API functions the host
          implementation of a reached API function calls itself
- the Metal source embedded in the host file (ds4's `ds4_gpu_source` prelude)
  is scanned as the first Metal file, as the host prepends it to the library.

A full scan is cached under <workspace>/runs/scan-cache/, keyed by the sha256
of every input byte, the target's scan settings and the scanner's own code, so
a re-scan of unchanged sources is one file read and one unpickle.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from porter.target.scan.engine import EngineGraph, scan_engine
from porter.target.scan.host import ApiDispatch, HostScan, Unresolved, scan_host
from porter.target.scan.metal import MetalScan, scan_metal

CACHE_DIR = Path("runs") / "scan-cache"
_CODE_FILES = ("__init__.py", "common.py", "metal.py", "host.py", "engine.py")
_FORMAT_SPEC = re.compile(r"%%|%[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z|j|t|L|q)?[diouxXscfeEgGp@]")


@dataclass
class InputFile:
    rel: str
    role: str  # api_header | metal_host | metal | engine
    sha256: str
    lines: int
    present: bool = True


@dataclass
class ScanResult:
    target: str
    checkout: str
    inputs: list[InputFile]
    api: list[str]  # API functions in header order (all of them)
    units: list[str]  # the ported ones (target.units)
    metal: MetalScan
    host: HostScan | None
    engine: EngineGraph | None
    unknown_kernels: dict[str, list[str]] = field(default_factory=dict)  # unit -> names not in the Metal library
    undispatched: list[str] = field(default_factory=list)  # host names no API function dispatches
    missing: list[str] = field(default_factory=list)  # inputs that do not exist (yet)
    seconds: float = 0.0
    from_cache: bool = False
    cache_path: str | None = None

    @property
    def lines(self) -> int:
        return sum(f.lines for f in self.inputs)

    def dispatch(self, unit: str) -> ApiDispatch | None:
        return self.host.api.get(unit) if self.host else None

    def unresolved(self) -> list[tuple[str, Unresolved]]:
        out = []
        if self.host:
            for u, ad in self.host.api.items():
                for x in ad.unresolved:
                    out.append((u, x))
        return out

    def reached(self, phase: str, unit: str) -> bool:
        return bool(self.engine and unit in self.engine.reach.get(phase, {}))


def _code_hash() -> str:
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _CODE_FILES:
        try:
            h.update((here / name).read_bytes())
        except OSError:
            pass
    h.update(sys.version.encode())
    return h.hexdigest()


def _inputs(target) -> list[tuple[str, str, Path]]:
    """(role, rel path, path) of everything the scan reads, in a stable order."""
    co = Path(target.checkout)

    def rel(p: Path) -> str:
        try:
            return str(Path(p).resolve().relative_to(co.resolve()))
        except ValueError:
            return str(p)

    out = [("api_header", rel(target.api_header), Path(target.api_header)),
           ("metal_host", rel(target.metal_host), Path(target.metal_host))]
    for p in target.metal_sources:
        out.append(("metal", rel(p), Path(p)))
    for p in target.engine_sources:
        out.append(("engine", rel(p), Path(p)))
    return out


def scan(target, *, cache: bool = True, cache_dir: Path | None = None) -> ScanResult:
    """Scan the target's sources (or load the cached scan of these exact bytes)."""
    t0 = time.perf_counter()
    files = _inputs(target)
    blobs: dict[str, bytes | None] = {}
    key = hashlib.sha256()
    key.update(_code_hash().encode())
    key.update(repr((target.name, target.symbol_prefix, sorted(target.entry_points.items()),
                     list(target.units))).encode())
    for role, rel, path in files:
        try:
            data = path.read_bytes()
        except OSError:
            data = None
        blobs[rel] = data
        key.update(f"{role}\0{rel}\0".encode())
        key.update(hashlib.sha256(data).digest() if data is not None else b"<missing>")
    digest = key.hexdigest()
    cdir = Path(cache_dir) if cache_dir is not None else Path(target.workspace) / CACHE_DIR
    cpath = cdir / f"{target.name}-{digest[:24]}.pickle"
    if cache and cpath.is_file():
        try:
            with open(cpath, "rb") as fh:
                res = pickle.load(fh)
            if isinstance(res, ScanResult):
                res.from_cache = True
                res.cache_path = str(cpath)
                res.seconds = time.perf_counter() - t0
                return res
        except Exception:  # a torn or foreign cache file is just a miss
            pass
    res = _scan(target, files, blobs)
    res.seconds = time.perf_counter() - t0
    if cache:
        try:
            cdir.mkdir(parents=True, exist_ok=True)
            tmp = cpath.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as fh:
                pickle.dump(res, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, cpath)
            res.cache_path = str(cpath)
            olds = sorted(cdir.glob(f"{target.name}-*.pickle"), key=lambda p: p.stat().st_mtime)
            for old in olds[:-4]:
                old.unlink(missing_ok=True)
        except OSError:
            pass
    return res


def _scan(target, files, blobs) -> ScanResult:
    inputs: list[InputFile] = []
    missing: list[str] = []
    for role, rel, _ in files:
        data = blobs[rel]
        if data is None:
            missing.append(rel)
            inputs.append(InputFile(rel, role, "", 0, present=False))
        else:
            inputs.append(InputFile(rel, role, hashlib.sha256(data).hexdigest(),
                                    data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)))
    api = [f.name for f in target.api]
    units = list(target.units)

    host_rel = next(rel for role, rel, _ in files if role == "metal_host")
    host = scan_host(host_rel, blobs[host_rel], api) if blobs.get(host_rel) is not None else None

    metal_sources = list(host.preludes) if host else []
    metal_sources += [(rel, blobs[rel]) for role, rel, _ in files if role == "metal" and blobs[rel] is not None]
    metal = scan_metal(metal_sources)

    engine_sources = [(rel, blobs[rel]) for role, rel, _ in files if role == "engine" and blobs[rel] is not None]
    host_api_calls = {u: ad.api_calls for u, ad in host.api.items()} if host else {}
    engine = scan_engine(engine_sources, api, target.entry_points, host_api_calls) if engine_sources else None

    res = ScanResult(target=target.name, checkout=str(target.checkout), inputs=inputs, api=api, units=units,
                     metal=metal, host=host, engine=engine, missing=missing)
    if host:
        names = set(metal.host_names)
        dispatched: set[str] = set()
        for u, ad in host.api.items():
            unknown = [k for k in ad.kernels if k not in names]
            if unknown:
                res.unknown_kernels[u] = unknown
            dispatched.update(ad.kernels)
            _add_candidates(ad, names)
            for x in ad.unresolved:
                dispatched.update(x.candidates)
        res.undispatched = sorted(n for n in names if n not in dispatched)
    return res


def _add_candidates(ad: ApiDispatch, names: set[str]) -> None:
    """An unresolved format pattern is matched against the library's host names."""

    def cands(pattern: str) -> tuple[str, ...]:
        if "%" not in pattern:
            return ()
        parts = _FORMAT_SPEC.split(pattern)
        specs = _FORMAT_SPEC.findall(pattern)
        rx = ""
        for i, part in enumerate(parts):
            rx += re.escape(part)
            if i < len(specs):
                rx += "%" if specs[i] == "%%" else (r"-?\d+" if specs[i][-1] in "diouxX" else r".+?")
        r = re.compile(rx + r"\Z")
        return tuple(sorted(n for n in names if r.match(n)))

    def fix(u: Unresolved) -> Unresolved:
        c = cands(u.pattern)
        return Unresolved(u.pattern, u.reason, u.where, c) if c else u

    ad.unresolved = [fix(u) for u in ad.unresolved]
    ad.sites = [
        type(s)(s.function, s.line, s.path, s.pipeline_expr, s.kernels, tuple(fix(u) for u in s.unresolved),
                s.bindings, s.grids)
        for s in ad.sites
    ]


__all__ = ["scan", "ScanResult", "InputFile"]
