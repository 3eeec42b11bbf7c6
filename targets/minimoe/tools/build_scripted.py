#!/usr/bin/env python3
"""Build minimoe's CUDA backend from the scripted good answers (no porter needed).

Used by tests/test_scripted_answers.py (compile checks in CI, no GPU) and by
tools/compare_cuda_cpu.py (on a GPU machine, where only python3 + numpy may be
installed).  It reads target.toml and scripted/manifest.toml itself, pulls the
one ```cuda block out of each answer, compiles every unit alone exactly as the
build gate does:

    nvcc -c <[cuda].nvcc_flags> -I targets/minimoe -I targets/minimoe/cuda \
         -include mini_cuda.cuh UNIT.cu -o UNIT.o

and links the glue and the 24 unit objects into libmini_cuda.so with
[cuda].link_flags.  Objects are cached by the sha256 of (source, flags, the
headers they include), so a second build in the same cache directory only links.

    python targets/minimoe/tools/build_scripted.py --out /tmp/minimoe_cuda
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TARGET_DIR = Path(__file__).resolve().parents[1]  # targets/minimoe
EXPECT_VALUES = ("pass", "extract", "static", "build", "parity", "perf")

# ```cuda ... ``` fences (also ```cu / ```c++ / ```cpp, which an LLM may use);
# the scripted answers themselves always say ```cuda.
_FENCE = re.compile(r"^```[ \t]*(cuda|cu|c\+\+|cpp)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Answer:
    unit: str
    file: str
    expect: str
    why: str
    index: int  # position in manifest.toml

    @property
    def path(self) -> Path:
        return TARGET_DIR / "scripted" / self.file


def target_config() -> dict:
    return tomllib.loads((TARGET_DIR / "target.toml").read_text())


def nvcc_flags() -> list[str]:
    """[cuda] nvcc_flags and the architecture: porter's choice when porter is importable (this machine's
    GPU, --arch / $PORTER_ARCH), else the declared default_arch."""
    cfg = target_config()["cuda"]
    try:
        from porter.host import arch
        archs = arch.choose(cfg["default_arch"]).archs
        return [*cfg["nvcc_flags"], *arch.nvcc_flags(archs)]
    except ImportError:
        return [*cfg["nvcc_flags"], f"-arch={os.environ.get('PORTER_ARCH') or cfg['default_arch']}"]


def api_units() -> list[str]:
    """Function names declared by mini_gpu.h, in header order (no porter needed)."""
    text = (TARGET_DIR / "mini_gpu.h").read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.findall(r"\b(mini_gpu_\w+)\s*\(", text)


def load_manifest() -> list[Answer]:
    raw = tomllib.loads((TARGET_DIR / "scripted" / "manifest.toml").read_text())
    out = []
    for i, a in enumerate(raw.get("answer", [])):
        out.append(Answer(unit=a.get("unit", ""), file=a.get("file", ""), expect=a.get("expect", ""),
                          why=a.get("why", ""), index=i))
    return out


def cuda_blocks(text: str) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(text)]


def good_answers() -> dict[str, Answer]:
    return {a.unit: a for a in load_manifest() if a.expect == "pass"}


def good_source(unit: str) -> str:
    a = good_answers()[unit]
    blocks = cuda_blocks(a.path.read_text())
    if len(blocks) != 1:
        raise SystemExit(f"{a.file}: expected exactly one ```cuda block, found {len(blocks)}")
    return blocks[0]


def nvcc() -> str:
    exe = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return exe


def compile_cmd(src: Path, obj: Path) -> list[str]:
    cfg = target_config()["cuda"]
    cuda_dir = TARGET_DIR / cfg.get("dir", "cuda")
    return [nvcc(), "-c", *nvcc_flags(), "-I", str(TARGET_DIR), "-I", str(cuda_dir),
            "-include", cfg["conventions_header"], str(src), "-o", str(obj)]


def _cache_key(source: str) -> str:
    cfg = target_config()["cuda"]
    h = hashlib.sha256()
    h.update(source.encode())
    h.update("\0".join(nvcc_flags()).encode())
    h.update((TARGET_DIR / "mini_gpu.h").read_bytes())
    h.update((TARGET_DIR / cfg.get("dir", "cuda") / cfg["conventions_header"]).read_bytes())
    return h.hexdigest()[:24]


@dataclass
class CompileResult:
    name: str
    ok: bool
    obj: Path | None
    log: str


def compile_source(name: str, source: str, cache_dir: Path) -> CompileResult:
    """Compile one translation unit alone; cached by content in cache_dir."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _cache_key(source)
    obj = cache_dir / f"{name}.{key}.o"
    fail = cache_dir / f"{name}.{key}.fail"
    if obj.exists():
        return CompileResult(name, True, obj, "")
    if fail.exists():
        return CompileResult(name, False, None, fail.read_text())
    src = cache_dir / f"{name}.{key}.cu"
    src.write_text(source)
    tmp_obj = cache_dir / f"{name}.{key}.o.tmp{os.getpid()}"
    proc = subprocess.run(compile_cmd(src, tmp_obj), capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0 and tmp_obj.exists():
        tmp_obj.replace(obj)
        return CompileResult(name, True, obj, log)
    tmp_obj.unlink(missing_ok=True)
    fail.write_text(log or f"nvcc exited {proc.returncode}")
    return CompileResult(name, False, None, log)


def compile_many(items: list[tuple[str, str]], cache_dir: Path, jobs: int = 2) -> dict[str, CompileResult]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda it: compile_source(it[0], it[1], cache_dir), items))
    return {r.name: r for r in results}


def glue_sources() -> list[tuple[str, str]]:
    cfg = target_config()["cuda"]
    cuda_dir = TARGET_DIR / cfg.get("dir", "cuda")
    return [(f"glue_{Path(g).stem}", (cuda_dir / g).read_text()) for g in cfg.get("glue", [])]


def build_library(out_dir: Path, cache_dir: Path | None = None, jobs: int = 2) -> Path:
    """Compile glue + every unit's good answer and link the backend library."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir else out_dir / "obj"
    units = api_units()
    items = glue_sources() + [(u, good_source(u)) for u in units]
    results = compile_many(items, cache_dir, jobs)
    failed = [r for r in results.values() if not r.ok]
    if failed:
        msg = "\n".join(f"--- {r.name}\n{r.log}" for r in failed)
        raise RuntimeError(f"{len(failed)} translation unit(s) failed to compile:\n{msg}")
    cfg = target_config()["cuda"]
    lib = out_dir / cfg["library"]
    cmd = [nvcc(), *[f for f in nvcc_flags() if f.startswith(("-arch", "-gencode", "arch="))],
           "-o", str(lib), *[str(results[name].obj) for name, _ in items], *cfg["link_flags"]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"link failed: {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return lib


def exported_symbols(lib: Path) -> set[str]:
    proc = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    syms = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "W"):
            syms.add(parts[2])
    return syms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="output folder for libmini_cuda.so")
    ap.add_argument("--cache", type=Path, default=None, help="object cache (default OUT/obj)")
    ap.add_argument("-j", "--jobs", type=int, default=max(2, min(8, os.cpu_count() or 2)))
    args = ap.parse_args(argv)
    lib = build_library(args.out, args.cache, args.jobs)
    missing = set(api_units()) - exported_symbols(lib)
    if missing:
        print(f"{lib}: missing exports: {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
