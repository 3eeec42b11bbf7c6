"""Scanner benchmark: `porter dev scan-bench --target NAME [--source DIR] [-C WORKSPACE]`.

Prints the seconds of a full scan with an empty cache (the first one in this
process, grammars loaded on the way, and a second one), of a cached re-scan,
and the lines scanned.  The cache used is a temporary folder, so the
workspace's own runs/scan-cache/ is neither read nor cleared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from porter.errors import PorterError


def bench(target, repeats: int = 3) -> dict:
    from porter.target.scan import scan

    with tempfile.TemporaryDirectory(prefix="porter-scan-bench-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        first = scan(target, cache_dir=tmp / "first")
        cold_first = time.perf_counter() - t0
        colds = []
        for i in range(max(1, repeats - 1)):
            t0 = time.perf_counter()
            scan(target, cache_dir=tmp / f"cold{i}")
            colds.append(time.perf_counter() - t0)
        warms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = scan(target, cache_dir=tmp / "first")
            warms.append(time.perf_counter() - t0)
            assert r.from_cache
    return {
        "target": target.name,
        "lines": first.lines,
        "files": len(first.inputs),
        "cold_first_s": round(cold_first, 3),
        "cold_s": round(min(colds), 3),
        "cached_s": round(min(warms), 4),
        "kernels": len(first.metal.kernels),
        "host_names": len(first.metal.host_names),
        "unresolved": len(first.unresolved()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev scan-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--source", metavar="DIR", help="the target's source checkout (default: PORTER_<T>_SOURCE, "
                                                     "then external/<target> of this repository)")
    ap.add_argument("-C", dest="workspace", default=None, help="workspace (default: this repository)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from porter.target import load_target

    ws = Path(a.workspace) if a.workspace else Path(__file__).resolve().parents[2]
    source = a.source
    if source is None and (ws / "external" / a.target).is_dir():
        from porter.target import _env_source_var
        import os

        source = os.environ.get(_env_source_var(a.target)) or str(ws / "external" / a.target)
    try:
        target = load_target(ws, a.target, source)
        res = bench(target, a.repeats)
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['target']}: {res['lines']} lines in {res['files']} files "
              f"({res['kernels']} kernels, {res['host_names']} host names, {res['unresolved']} unresolved)")
        print(f"  full scan, empty cache, first in process: {res['cold_first_s']:.3f} s")
        print(f"  full scan, empty cache:                   {res['cold_s']:.3f} s")
        print(f"  cached re-scan:                           {res['cached_s']:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
