"""ds4's e2e driver (porter.gates.e2e.target_driver): ds4 reduced, the user's ds4 built with few layers
in a scratch folder, on a synthetic real-width GGUF (gguf.py beside this file).

Steps, each a function the tests exercise without a GPU where they can:
  scratch_copy   copy the checkout, apply targets/ds4/e2e/patches.toml (the layer
                 count and our accessor hooks), add ds4_e2e_accessor.c and a make
                 fragment that links it
  make_command   ds4's Makefile: `cpu` for the reference, `ds4 CUDA_ARCH=...` for a
                 CUDA build (upstream ds4_cuda.cu, or a library in its place)
  run_command    one prefill of the prompt (+1 token) with the accessor's env
  read_states    the accessor's records -> [layer][sampled token][hc state]
The prompt is long enough for the indexer (> 2048 tokens); the sampled tokens
include the first, every `stride`-th and the last 16, so a fault is localised
to a layer and roughly a token.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from porter.calibration import libraries
from porter.gates.mutants import rule_mutants
from porter.errors import PorterError
from porter.gates.e2e import cbuild
from porter.gates.e2e.compare import PrefillOutputs, ReferenceFailure
from porter.target.code import sibling
from porter.term import Steps
from porter.term import console as term_console
from porter.tomlfile import read_toml

HC_ROW = 4 * 4096  # DS4_N_HC * DS4_N_EMBD floats per token
N_EMBD = 4096
N_VOCAB = 129280
ACCESSOR = "ds4_e2e_accessor.c"
LOGPROB_SOURCE = "ds4_e2e_logprob.c"  # porter's driver for the official logprob vectors (logprob.py)
LOGPROB_EXE = "ds4_e2e_logprob"
MAKE_FRAGMENT = "porter_e2e.mk"
ACCURACY_PATCHES = "accuracy_patches.toml"  # the throughput builds' logits-of-every-row hook (porter.gates.e2e.accuracy)
LOGIT_ROWS = "logit-rows.f32"
RUN_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 1200
_SKIP_DIRS = {".git", "gguf-tools", "speed-bench", "dir-steering"}


def load_patch_rules(target, name: str = "patches.toml") -> list[dict]:
    path = target.dir / "e2e" / name
    rules = read_toml(path, why_needed="the e2e build's patch rules").get("rule", [])
    for i, r in enumerate(rules):
        if not all(isinstance(r.get(k), str) for k in ("file", "old", "new")):
            raise PorterError(f"{path}: rule {i + 1} needs file, old and new strings")
    return rules


def apply_patch_rules(text: str, rules: list[dict], file: str, n_layer: int) -> str:
    for i, r in enumerate(rules):
        if r["file"] != file:
            continue
        n = text.count(r["old"])
        if n != 1:
            raise PorterError(f"patch rule {i + 1} ({r.get('why', '')}): its text occurs {n} times in {file}, "
                              f"must occur exactly once (another ds4 revision? re-read the rules)")
        text = text.replace(r["old"], r["new"].replace("{layers}", str(int(n_layer))), 1)
    return text


def make_fragment() -> str:
    """Rules for the accessor's objects, added to ds4's Makefile with `make -f Makefile -f porter_e2e.mk`."""
    return (
        "# porter e2e: the accessor linked into the reduced build (see ds4_e2e_accessor.c)\n"
        "ds4_e2e_accessor.o: ds4_e2e_accessor.c ds4_gpu.h\n"
        "\t$(CC) $(CFLAGS) -c -o $@ ds4_e2e_accessor.c\n"
        "ds4_e2e_accessor_cpu.o: ds4_e2e_accessor.c\n"
        "\t$(CC) $(CFLAGS) -DDS4_NO_GPU -c -o $@ ds4_e2e_accessor.c\n"
        "# porter's logprob-vector driver (see ds4_e2e_logprob.c and logprob.py)\n"
        f"{LOGPROB_EXE}.o: {LOGPROB_SOURCE} ds4.h\n"
        f"\t$(CC) $(CFLAGS) -c -o $@ {LOGPROB_SOURCE}\n"
        f"{LOGPROB_EXE}: {LOGPROB_EXE}.o $(CORE_OBJS)\n"
        f"\t$(NVCC) $(NVCCFLAGS) -o $@ {LOGPROB_EXE}.o $(CORE_OBJS) $(CUDA_LDLIBS)\n"
        f"{LOGPROB_EXE}_cpu: {LOGPROB_EXE}.o $(CPU_CORE_OBJS)\n"
        f"\t$(CC) $(CFLAGS) -o $@ {LOGPROB_EXE}.o $(CPU_CORE_OBJS) $(LDLIBS)\n"
    )


def scratch_copy(target, dest: Path, n_layer: int, cuda_rules: list[tuple[str, str]] = (), *,
                 accuracy: bool = False) -> Path:
    """A patched copy of the checkout in dest (made fresh); cuda_rules mutate its ds4_cuda.cu; `accuracy`
    adds the rules of accuracy_patches.toml after patches.toml's (the throughput builds only)."""
    src = Path(target.checkout)
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    rules = load_patch_rules(target) + (load_patch_rules(target, ACCURACY_PATCHES) if accuracy else [])
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        rel = Path(root).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            p = Path(root) / f
            if p.suffix in (".o", ".gguf") or not p.is_file():
                continue
            shutil.copy2(p, dest / rel / f)
    ds4c = dest / "ds4.c"
    ds4c.write_text(apply_patch_rules(ds4c.read_text(), rules, "ds4.c", n_layer))
    if cuda_rules:
        cu = dest / "ds4_cuda.cu"
        text = cu.read_text()
        for i, (search, replace) in enumerate(cuda_rules):
            n = text.count(search)
            if n != 1:
                raise PorterError(f"ds4_cuda.cu rule {i + 1}: search text occurs {n} times, must occur once")
            text = text.replace(search, replace, 1)
        cu.write_text(text)
    shutil.copy2(target.dir / "e2e" / ACCESSOR, dest / ACCESSOR)
    shutil.copy2(target.dir / "e2e" / LOGPROB_SOURCE, dest / LOGPROB_SOURCE)
    (dest / MAKE_FRAGMENT).write_text(make_fragment())
    return dest


# the flags of ds4's Makefile that change what the code computes: upstream's side of every engine run is
# built with them; the port's library is porter's build, with the target's [cuda] nvcc_flags
UPSTREAM_MATH_FLAGS = "-O3 --use_fast_math"


def make_command(build_dir: Path, backend: str, *, library: Path | None = None, cuda_arch: str = "sm_90",
                 jobs: int = 8, program: str = "ds4") -> list[str]:
    """backend 'cpu' -> ds4's `make cpu`; 'cuda' -> `make <program>` (ds4, or ds4-bench for throughput)
    with ds4_cuda.o, or `library` in its place."""
    base = ["make", "-C", str(build_dir), "-f", "Makefile", "-f", MAKE_FRAGMENT, f"-j{jobs}"]
    if backend == "cpu":
        return base + ["cpu", "CPU_CORE_OBJS=ds4_cpu.o ds4_e2e_accessor_cpu.o"]
    if backend != "cuda":
        raise PorterError(f"unknown ds4 backend {backend!r} (cpu or cuda)")
    core = "ds4.o ds4_e2e_accessor.o " + (str(Path(library).resolve()) if library else "ds4_cuda.o")
    # ds4's own NVCCFLAGS without -g -lineinfo: the same code and math flags, a faster compile
    # (nine builds of ds4_cuda.cu run side by side in a calibration)
    nvccflags = (f"NVCCFLAGS={UPSTREAM_MATH_FLAGS} -arch={cuda_arch} -Xcompiler -march=native "
                 "-Xcompiler -pthread")
    cmd = base + [program, f"CUDA_ARCH={cuda_arch}", f"CORE_OBJS={core}", nvccflags]
    nvcc = shutil.which("nvcc")
    if nvcc:  # ds4's Makefile assumes /usr/local/cuda; use the toolkit on PATH
        from porter.host.toolchain import toolkit_root

        cmd += [f"NVCC={nvcc}", f"CUDA_HOME={toolkit_root(nvcc)}"]
    if library:
        lib_dir = Path(library).resolve().parent
        cmd.append("CUDA_LDLIBS=-lm -Xcompiler -pthread -L$(CUDA_HOME)/lib64 -lcudart -lcublas "
                   f"-Xlinker -rpath -Xlinker {lib_dir}")
    return cmd


def prompt_text(n_tokens: int) -> str:
    """About n_tokens byte tokens of text (the synthetic vocabulary has no merges that apply)."""
    words = []
    x = 12345
    while sum(len(w) + 1 for w in words) <= n_tokens + 1:
        x = (x * 1103515245 + 12345) % (1 << 31)
        words.append("".join(chr(ord("a") + (x >> (5 * k)) % 26) for k in range(4)))
    return " ".join(words)[:n_tokens].rstrip().ljust(n_tokens, "a")


def sampled_positions(n_prompt: int, stride: int = 64, tail: int = 16, beyond: int = 48) -> list[int]:
    """Every stride-th position, and a run around the end of the text: the chat template adds
    tokens ds4 places around it, so the prompt ends some way past n_prompt; positions past the
    real end are simply never recorded."""
    return sorted(set(range(0, n_prompt, stride)) | set(range(max(0, n_prompt - tail), n_prompt + beyond)))


def run_command(build_dir: Path, model: Path, backend: str, prompt_file: Path, ctx: int) -> list[str]:
    return [str(Path(build_dir) / "ds4"), "-m", str(model), f"--{backend}", "--prompt-file", str(prompt_file),
            "-n", "1", "--temp", "0", "--nothink", "-c", str(ctx)]


def run_env(out_dir: Path, positions: list[int], extra: dict | None = None, threads: int | None = None) -> dict:
    """The whole environment of a sandboxed run besides the sandbox's own (porter.gates.e2e.cbuild.run_engine)."""
    env = {}
    # CPU: our accessor writes the prefill logits; GPU: ds4's CLI does (DS4_METAL_DUMP_PREFILL_LOGITS)
    env.update({"DS4_E2E_STATES": str(out_dir / "states.bin"), "DS4_E2E_LOGITS": str(out_dir / "logits.f32"),
                "DS4_E2E_HEAD": str(out_dir / "head.f32"),
                "DS4_METAL_DUMP_PREFILL_LOGITS": str(out_dir / "logits.f32"),
                "DS4_E2E_TOKENS": ",".join(map(str, positions)),
                "DS4_THREADS": str(threads or os.cpu_count() or 1),
                # ds4 refuses to start while another ds4 holds its instance lock (/tmp/ds4.lock by
                # default): the CPU reference runs beside the GPU builds, so each run has its own
                "DS4_LOCK_FILE": str(out_dir / "ds4.lock")})
    env.update(extra or {})
    return env


MAX_POSITIONS = 65536  # the accessor's E2E_MAX_POS: it records no position past it


def read_states(path: Path, n_layer: int, row: int = HC_ROW, n_positions: int = MAX_POSITIONS
                ) -> tuple[np.ndarray, list[int]]:
    """The accessor's records -> ([n_layer][n_pos][row] float32, positions). A record is int32 il,
    int32 pos, then row floats; every layer must have the same positions (a prefill in chunks
    still records each position once per layer).  The file is the engine's: read only as a regular
    file of at most n_layer x n_positions records."""
    rec = 8 + 4 * row
    raw = cbuild.read_engine_output(Path(path), n_layer * n_positions * rec)
    if not raw or len(raw) % rec:
        raise PorterError(f"{path}: {len(raw)} bytes is not a whole number of {rec}-byte state records")
    by_layer: dict[int, dict[int, np.ndarray]] = {}
    for off in range(0, len(raw), rec):
        il, pos = np.frombuffer(raw, dtype=np.int32, count=2, offset=off)
        by_layer.setdefault(int(il), {})[int(pos)] = np.frombuffer(raw, dtype=np.float32, count=row, offset=off + 8)
    if sorted(by_layer) != list(range(n_layer)):
        raise PorterError(f"{path}: states for layers {sorted(by_layer)}, expected 0..{n_layer - 1}")
    positions = sorted(by_layer[0])
    for il, rows in by_layer.items():
        if sorted(rows) != positions:
            raise PorterError(f"{path}: layer {il} has other positions than layer 0")
    states = np.stack([np.stack([by_layer[il][p] for p in positions]) for il in range(n_layer)])
    return states, positions


def _floats(path: Path, n: int) -> np.ndarray:
    """Up to n float32 values of an engine's output file; missing gives none (the caller's size check
    names what is missing), anything but a regular file of at most 4n bytes is a PorterError."""
    try:
        raw = cbuild.read_engine_output(path, 4 * n)
    except PorterError:
        if not os.path.lexists(path):
            return np.zeros(0, dtype=np.float32)
        raise
    return np.frombuffer(raw[:len(raw) - len(raw) % 4], dtype=np.float32).copy()


def run_sandboxed(what: str, cmd: list[str], reads: list[Path], out: Path, env: dict) -> float:
    """One engine run in the sandbox, writing only `out` (its stderr kept there as stderr.txt); a timeout
    or a non-zero exit is a PorterError naming `what`.  Returns the run's wall time on porter's clock,
    taken from outside the process the candidate's code runs in."""
    t0 = time.monotonic()
    try:
        proc = cbuild.run_engine(cmd, reads=reads, writes=[out], env=env, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PorterError(f"{what} ran past {RUN_TIMEOUT_S}s") from None
    wall = time.monotonic() - t0
    (out / "stderr.txt").write_text(proc.stderr)
    if proc.returncode != 0:
        raise PorterError(f"{what} failed (exit {proc.returncode}): "
                          f"{(proc.stderr.strip().splitlines() or ['no message'])[-1][:300]}")
    return wall


# ------------------------------------------------------------------ the reduced run

@dataclass
class Ds4Variant:
    name: str
    kind: str  # good | broken | reference
    why: str = ""
    backend: str = "cuda"  # cpu | cuda
    source: str = "upstream"  # upstream | porter-library | library
    rules: list[tuple[str, str]] = field(default_factory=list)  # ds4_cuda.cu mutations
    env: dict = field(default_factory=dict)
    library: Path | None = None
    accuracy: bool = False  # built with accuracy_patches.toml's hook (the throughput gate's builds)


class Ds4Reduced:
    def __init__(self, target, scratch: Path, model: Path | None = None, *, jobs: int | None = None):
        spec = target.spec.e2e
        self.target = target
        self.scratch = Path(scratch)
        self.n_layer = spec.layers or 5
        self.n_prompt = spec.prompt_tokens
        self.opts = spec.options
        self.jobs = jobs or os.cpu_count() or 4
        self.model = Path(model) if model else self.scratch / f"ds4-synthetic-{self.n_layer}l.gguf"
        self.positions = sampled_positions(self.n_prompt, int(self.opts.get("token_stride", 64)))
        self.prompt_file = self.scratch / "prompt.txt"

    @property
    def stage_names(self) -> list[str]:
        return [f"layer {i}" for i in range(self.n_layer)]

    def ensure_model(self, log=print) -> Path:
        if not self.model.is_file():
            t0 = time.monotonic()
            sibling(__file__, "gguf").write_gguf(self.model.with_suffix(".partial"), self.n_layer, seed=int(self.opts.get("seed", 0)))
            os.replace(self.model.with_suffix(".partial"), self.model)
            log(f"synthetic GGUF {self.model} ({self.model.stat().st_size / 1e9:.1f} GB) in {time.monotonic() - t0:.0f}s")
        return self.model

    def setup(self) -> dict:
        from porter.digest import sha256_file

        return {"layers": self.n_layer, "prompt_tokens": self.n_prompt, "positions": self.positions,
                "stages": self.stage_names, "probes": ["head"], "model_seed": int(self.opts.get("seed", 0)),
                "ds4_c_sha256": sha256_file(Path(self.target.checkout) / "ds4.c"),
                "patches_sha256": sha256_file(self.target.dir / "e2e" / "patches.toml"),
                # the accessor writes the stage and head rows the rule's ceilings were measured on
                "accessor_sha256": sha256_file(self.target.dir / "e2e" / ACCESSOR),
                "reference": "ds4 CPU path (make cpu, --cpu)"}

    def build_key(self, v: Ds4Variant) -> str:
        """Variants that differ only in their environment share one build."""
        import hashlib

        files = ("patches.toml", ACCESSOR) + ((ACCURACY_PATCHES,) if v.accuracy else ())
        ours = b"".join((self.target.dir / "e2e" / f).read_bytes() for f in files)
        what = (v.backend, v.source, v.rules, str(v.library), self.n_layer, self.target.arch.archs)
        h = hashlib.sha256(repr(what + (("accuracy",) if v.accuracy else ())).encode() + ours)
        return f"{v.backend}-{v.source}-{h.hexdigest()[:10]}"

    def build(self, v: Ds4Variant, program: str = "ds4") -> Path:
        d = self.scratch / "build" / self.build_key(v)
        exe = d / program
        if exe.is_file():
            return d
        if not (d / MAKE_FRAGMENT).is_file():  # a program of a build made before shares its objects
            scratch_copy(self.target, d, self.n_layer, v.rules, accuracy=v.accuracy)
        cmd = make_command(d, v.backend, library=v.library, cuda_arch=self.target.arch.archs[-1],
                           jobs=max(1, min(self.jobs, 8)), program=program)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        (d / "porter-build.log").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0 or not exe.is_file():
            err = next((l for l in (proc.stderr + proc.stdout).splitlines() if "error" in l.lower()), "see porter-build.log")
            raise PorterError(f"ds4 build {v.name} failed: {err[:300]}")
        return d

    @staticmethod
    def linked(v: Ds4Variant) -> list[Path]:
        """The backend library v's executable loads at run time (shown to its sandboxed run)."""
        return [Path(v.library).resolve()] if v.library else []

    def run(self, build_dir: Path, v: Ds4Variant) -> PrefillOutputs:
        out = self.scratch / "out" / v.name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        if not self.prompt_file.is_file():
            self.prompt_file.write_text(prompt_text(self.n_prompt))
        cmd = run_command(build_dir, self.model, v.backend, self.prompt_file, ctx=self.n_prompt + 256)
        # the CPU reference leaves two cores to the GPU runs it overlaps with
        threads = max(1, (os.cpu_count() or 4) - 2) if v.backend == "cpu" else None
        wall = run_sandboxed(f"ds4 {v.name}", cmd, [build_dir, self.model, self.prompt_file, *self.linked(v)], out,
                             run_env(out, self.positions, v.env, threads))
        # the exit code and stderr above are diagnostics (a failure fails closed); what is judged is
        # what porter reads and checks from the files the run wrote
        # (bounded at twice the records a prefill makes: room for a path that records a position again)
        states, positions = read_states(out / "states.bin", self.n_layer, n_positions=2 * len(self.positions))
        if positions != [p for p in self.positions if p <= positions[-1]] or positions[-1] < self.n_prompt - 1:
            raise PorterError(f"ds4 {v.name}: recorded positions ...{positions[-3:]} are not the requested ones "
                              f"up to the prompt's end (the prompt encoded to fewer tokens than its text?)")
        logits = _floats(out / "logits.f32", N_VOCAB)
        if logits.size != N_VOCAB:
            raise PorterError(f"ds4 {v.name}: {logits.size} logits, expected {N_VOCAB}")
        head = _floats(out / "head.f32", N_EMBD)
        if head.size != N_EMBD:
            raise PorterError(f"ds4 {v.name}: {head.size} values of the output head's row, expected {N_EMBD} "
                              f"(the accessor's head hook did not run: another prefill path?)")
        return PrefillOutputs(states, self.stage_names, logits[None, :], [int(np.argmax(logits))], wall,
                              probes={"head": head})

    def run_reference(self, build_dir: Path, v: Ds4Variant) -> PrefillOutputs:
        """The CPU reference, run once per (build, model, prompt, positions) and kept in the scratch:
        it takes minutes and the CPU path gives the same outputs for the same inputs; a calibration
        that changes only the CUDA variants reuses it (the file is keyed, not trusted by name)."""
        import hashlib
        import zipfile

        if not self.model.is_file():
            return self.run(build_dir, v)
        st = self.model.stat()
        key = hashlib.sha256(repr((self.build_key(v), str(self.model.resolve()), st.st_size, st.st_mtime_ns,
                                   self.positions, prompt_text(self.n_prompt), v.env)).encode()).hexdigest()[:16]
        path = self.scratch / "reference-cache" / f"{key}.npz"
        if path.is_file():
            try:
                z = np.load(path)
                return PrefillOutputs(z["states"], self.stage_names, z["logits"], [int(t) for t in z["tokens"]],
                                      float(z["wall_s"]), probes={"head": z["head"]})
            except (OSError, ValueError, KeyError, zipfile.BadZipFile):
                path.unlink(missing_ok=True)  # unreadable: run it again rather than trust it
        out = self.run(build_dir, v)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial.npz")
        np.savez(tmp, states=out.states, logits=out.logits, tokens=np.asarray(out.tokens),
                 wall_s=np.float64(out.wall_s or 0.0), head=out.probes["head"])
        os.replace(tmp, path)
        return out


def load_variants(target) -> list[Ds4Variant]:
    data = read_toml(target.dir / "e2e" / "variants.toml", why_needed="the e2e calibration's backends")
    mutants = {m.name: m for m in rule_mutants(target)}
    out = []
    for kind in ("good", "broken"):
        for v in data.get(kind, []):
            rules = [(r["search"], r["replace"]) for r in v.get("rule", [])]
            why = v.get("why", "")
            if "mutant" in v:
                m = mutants.get(v["mutant"])
                if m is None:
                    raise PorterError(f"{path}: mutant {v['mutant']!r} is not in {target.name}/mutants.toml")
                if m.file != "ds4_cuda.cu":
                    raise PorterError(f"{path}: mutant {m.name} mutates {m.file}, not ds4_cuda.cu")
                rules = [(r.search, r.replace) for r in m.rules]
                why = why or f"{m.unit}: {m.why}"
            out.append(Ds4Variant(v["name"], kind, why, "cuda", v.get("source", "upstream"), rules,
                                  dict(v.get("env", {}))))
    return out


def _build_all(red: Ds4Reduced, variants: list[Ds4Variant], log) -> dict[str, Path | Exception]:
    """Every distinct build side by side (each CUDA build is one long nvcc of ds4_cuda.cu, and
    porter's library of the upstream backend is one more), so the wall time is about one build."""
    t0 = time.monotonic()
    groups: dict[str, list[Ds4Variant]] = {}
    for v in variants:
        groups.setdefault(red.build_key(v), []).append(v)

    def one(key: str):
        members = groups[key]
        try:
            if members[0].library is None and members[0].source in ("porter-library", "reference-slices"):
                lib = (libraries.build_upstream(red.target) if members[0].source == "porter-library"
                       else reference_slices_library(red.target, red.scratch / "build-cache"))
                for m in members:
                    m.library = lib
            return key, red.build(members[0])
        except PorterError as exc:
            return key, exc
        finally:
            steps.advance()
    # a bar on a terminal, a line every tenth of the builds in a log (minutes of nvcc otherwise silent)
    with Steps("ds4 e2e builds", len(groups), console=term_console(), plain=log) as steps, \
            ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        by_key = dict(pool.map(one, list(groups)))
    failed = [str(r) for r in by_key.values() if isinstance(r, Exception)]
    log(f"built {len(groups)} ds4 builds for {len(variants)} variants in {time.monotonic() - t0:.0f}s"
        + (f"; {len(failed)} failed: {'; '.join(failed)[:500]}" if failed else ""))
    return {v.name: by_key[key] for key, members in groups.items() for v in members}


def reference_slices_library(target, cache: Path) -> Path:
    """porter's own backend library as `porter run --provider reference` ports it: every unit's
    slice of the checkout's ds4_cuda.cu (adapted by the declared rules), each compiled alone with
    the conventions header, linked with porter's glue.  The e2e gate links a workspace's library
    the same way, so this known-good is the gate's normal path with correct units."""
    from porter.gates.extract import extract_unit_source
    from porter.providers.reference import ReferenceProvider

    prov = ReferenceProvider(target)
    sources = {u: extract_unit_source(prov.answer(u, 1)[0], u, target) for u in target.units}
    libs = libraries.SourceLibraries(target, cache, sources, "reference-provider slices")
    try:
        return libs.known_good()
    except libraries.BuildError as exc:
        raise PorterError(f"porter's library of the reference slices: {exc}") from None


def prepare_ds4(target, scratch: Path, model: Path | None = None, log=print) -> None:
    """The slow half of a calibration: the synthetic GGUF and every build (kept in scratch)."""
    red = Ds4Reduced(target, scratch, model)
    red.ensure_model(log)
    _build_all(red, [Ds4Variant("reference-cpu", "reference", backend="cpu"), *load_variants(target)], log)


def calibrate(target, scratch: Path, *, mode: str = "cuda", model: Path | None = None, library: str | None = None,
              log=print):
    """Every row of e2e/variants.toml (all CUDA builds; `mode` has no CPU-only subset here)."""
    from porter.gates.e2e import calibration as cal_mod
    from porter.gates.e2e.compare import Comparison, compare

    red = Ds4Reduced(target, scratch, model)
    red.ensure_model(log)
    ref_v = Ds4Variant("reference-cpu", "reference", backend="cpu")
    variants = load_variants(target)
    built = _build_all(red, [ref_v, *variants], log)
    if isinstance(built[ref_v.name], Exception):
        raise PorterError(f"reference build failed: {built[ref_v.name]}")
    # The CPU reference (minutes at 2k tokens) runs beside the GPU variants, which need the GPU
    # and little CPU; every comparison waits for it.
    with ThreadPoolExecutor(max_workers=1) as pool:
        ref_future = pool.submit(red.run_reference, built[ref_v.name], ref_v)
        outputs: dict[str, PrefillOutputs | PorterError] = {}
        for v in variants:
            b = built[v.name]
            try:
                if isinstance(b, Exception):
                    raise b
                outputs[v.name] = red.run(b, v)
                log(f"  {v.name}: {outputs[v.name].wall_s:.1f}s")
            except PorterError as exc:
                outputs[v.name] = exc
                log(f"  {v.name}: failed: {exc}")
        ref = ref_future.result()
    log(f"reference (CPU) prefill of ~{red.n_prompt} tokens x {red.n_layer} layers: {ref.wall_s:.1f}s")
    base = outputs.get("upstream-cuda")
    rows = []
    for v in variants:
        o = outputs[v.name]
        if isinstance(o, PrefillOutputs):
            cmp, wall = compare(ref, o), o.wall_s
            # a mutant of the upstream source whose outputs equal the unmutated build's bit for bit
            # never ran its mutated code in this prefill
            unreached = (v.kind == "broken" and v.source == "upstream" and not v.env
                         and isinstance(base, PrefillOutputs) and np.array_equal(o.states, base.states)
                         and np.array_equal(o.logits, base.logits))
        else:
            cmp = Comparison(ref.stage_names, np.full(ref.states.shape[:2], np.inf), float("inf"), ref.tokens, [],
                             problem=f"run failed: {o}")
            wall, unreached = None, False
        rows.append(cal_mod.Variant(v.name, v.kind, cmp, v.why, wall, unreached))
    setup = red.setup()
    return cal_mod.calibrate(rows, tokens_exact=False, setup=setup)


def prefill_pair(target, scratch: Path, library: Path, model: Path | None):
    """The gate: the reference CPU build vs a build linked with the workspace's library."""

    red = Ds4Reduced(target, scratch, model)
    red.ensure_model(lambda *_: None)
    ref_v = Ds4Variant("reference-cpu", "reference", backend="cpu")
    cand_v = Ds4Variant("candidate", "candidate", source="library", library=Path(library))
    try:
        ref = red.run_reference(red.build(ref_v), ref_v)
    except PorterError as exc:
        raise ReferenceFailure(f"reference backend: {exc}") from exc
    built = red.build(cand_v)
    # [e2e] runs prefills: CUDA runs are not bit-reproducible here, and their spread is what
    # `porter optimize` allows a new unit against the committed backend (porter.gates.e2e.unchanged)
    return ref, [red.run(built, cand_v) for _ in range(target.spec.e2e.runs)], red.setup()


# ------------------------------------------------------------------ throughput (porter.gates.e2e.throughput_gate)

BENCH_EXE = "ds4-bench"
BENCH_CSV_MAX = 4096  # a header and one frontier's row
BENCH_HEADER = "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"


def bench_command(build_dir: Path, model: Path, prompt_file: Path, csv: Path, prefill: int, decode: int) -> list[str]:
    """ds4-bench at one frontier: a prefill of `prefill` tokens from an empty context, then `decode`
    greedy steps at that depth (EOS skipped, so every run decodes the same count)."""
    return [str(Path(build_dir) / BENCH_EXE), "-m", str(model), "--cuda", "--prompt-file", str(prompt_file),
            "--ctx-start", str(prefill), "--ctx-max", str(prefill), "--gen-tokens", str(decode), "--csv", str(csv)]


def parse_bench_csv(raw: bytes, backend: str, wall_s: float):
    """ds4-bench's CSV as a throughput.Sample: exactly its header and one row of numbers, or PorterError
    (the engine's process wrote it, and a process holding the candidate's code can write anything)."""
    from porter.gates.e2e.throughput import Sample

    try:
        lines = raw.decode("ascii").strip().splitlines()
    except UnicodeDecodeError:
        raise PorterError("ds4-bench's CSV is not ASCII text") from None
    if len(lines) != 2 or lines[0].strip() != BENCH_HEADER:
        raise PorterError(f"ds4-bench's CSV is not its header and one row ({len(lines)} line(s))")
    cells = lines[1].split(",")
    try:
        ctx, pre_tok, pre_tps, gen_tok, gen_tps, _kv = (int(cells[0]), int(cells[1]), float(cells[2]),
                                                         int(cells[3]), float(cells[4]), int(cells[5]))
    except (ValueError, IndexError):
        raise PorterError(f"ds4-bench's row is not six numbers: {lines[1][:120]!r}") from None
    if not (pre_tps > 0 and gen_tps > 0) or ctx != pre_tok:
        raise PorterError(f"ds4-bench's row does not describe one prefill from empty: {lines[1][:120]!r}")
    # the CSV gives rates (2 decimals); the judge works in seconds, the unit porter's clock measures
    return Sample(backend, wall_s, pre_tok, pre_tok / pre_tps, gen_tok, gen_tok / gen_tps)


class Ds4Bench:
    """Two builds of ds4-bench on the fixture: upstream's backend and the workspace's library."""

    n_vocab = N_VOCAB  # the width of a logits_rows record (porter.gates.e2e.accuracy)

    def __init__(self, red: Ds4Reduced, builds: dict[str, tuple[Path, Ds4Variant]], prefill: int, decode: int):
        self.red, self.builds, self.prefill, self.decode = red, builds, prefill, decode
        self.prompt_file = red.scratch / "bench-prompt.txt"
        # byte tokens: a margin past the frontier, since ds4-bench refuses a prompt shorter than it
        self.prompt_file.write_text(prompt_text(prefill + 64))
        self.setup = {"engine": BENCH_EXE, "layers": red.n_layer, "model_seed": int(red.opts.get("seed", 0)),
                      "prefill_tokens": prefill, "decode_tokens": decode, "upstream": "ds4_cuda.cu of the checkout"}

    def _bench(self, backend: str, label: str, folder: str, decode: int, extra_env=None) -> tuple[Path, float]:
        """One sandboxed ds4-bench run of `backend`'s build in a fresh folder under scratch/`folder`, its
        report in bench.csv there; extra_env(folder) adds variables naming files in it.
        (that folder, porter's wall time of the run)."""
        build_dir, v = self.builds[backend]
        out = self.red.scratch / folder / f"{backend}-{time.monotonic_ns()}"
        out.mkdir(parents=True)
        cmd = bench_command(build_dir, self.red.model, self.prompt_file, out / "bench.csv", self.prefill, decode)
        env = {"DS4_THREADS": str(os.cpu_count() or 1), "DS4_LOCK_FILE": str(out / "ds4.lock"),
               **(extra_env(out) if extra_env else {})}
        wall = run_sandboxed(f"{label} ({backend})", cmd,
                             [build_dir, self.red.model, self.prompt_file, *self.red.linked(v)], out, env)
        return out, wall

    def run(self, backend: str):
        out, wall = self._bench(backend, "ds4-bench", "bench-out", self.decode)
        return parse_bench_csv(cbuild.read_engine_output(out / "bench.csv", BENCH_CSV_MAX), backend, wall)

    def logit_rows(self, backend: str) -> Path:
        """One untimed ds4-bench prefill of the frontier (and one decode step) with accuracy_patches.toml's
        hook on: the file of every prompt position's logits, by the build's own output head, for
        porter.gates.e2e.accuracy to read (it removes the file, a GB, once read)."""
        out, _ = self._bench(backend, "ds4-bench logits of every position", "accuracy-out", 1,
                             lambda folder: {"DS4_E2E_LOGIT_ROWS": str(folder / LOGIT_ROWS)})
        return out / LOGIT_ROWS


def throughput_runner(target, scratch: Path, library: Path, model: Path | None, *, prefill_tokens: int,
                      decode_tokens: int, log=print) -> Ds4Bench:
    from porter.gates.e2e.throughput import CANDIDATE, UPSTREAM

    red = Ds4Reduced(target, scratch, model)
    # both builds carry the accuracy hook (idle unless its variable is set), so the gate's accuracy runs use
    # the very executables it timed
    up = Ds4Variant("upstream-cuda", "reference", source="upstream", accuracy=True)
    # library None: upstream against itself (the A/A check), the same executable on both sides
    cand = up if library is None else Ds4Variant("candidate", "candidate", source="library", library=Path(library),
                                                 accuracy=True)
    # the fixture (GBs written) and two long nvcc builds, side by side
    with ThreadPoolExecutor(max_workers=3) as pool:
        model_f = pool.submit(red.ensure_model, log)
        up_f = pool.submit(red.build, up, BENCH_EXE)
        cand_f = up_f if cand is up else pool.submit(red.build, cand, BENCH_EXE)
        model_f.result()
        try:
            up_dir = up_f.result()
        except PorterError as exc:
            raise ReferenceFailure(f"upstream's ds4-bench: {exc}") from exc
        cand_dir = cand_f.result()
    return Ds4Bench(red, {UPSTREAM: (up_dir, up), CANDIDATE: (cand_dir, cand)}, prefill_tokens, decode_tokens)


def _prepare_command(target, args, scratch: Path) -> int:
    prepare_ds4(target, scratch, args.model)
    return 0


def _logprob_command(target, args, scratch: Path) -> int:
    if not args.model or not args.library:
        raise PorterError("logprob needs --model (the real GGUF) and --library (the workspace's backend)")
    res = sibling(__file__, "logprob").run_logprob_vectors(target, args.workspace, Path(args.library), args.model,
                                                          scratch)
    print(res.summary)
    return 0 if res.ok else 1


def _library_arg(target, args, scratch: Path) -> tuple[str, Path | None]:
    """--library as throughput and accuracy read it: a path, `reference` or `upstream` (None: the A/A run)."""
    which = args.library or "reference"
    if which == "reference":
        return which, reference_slices_library(target, scratch / "build-cache")
    return which, None if which == "upstream" else Path(which)


def _accuracy_command(target, args, scratch: Path) -> int:
    """Mean KLD and same-top-token rate of --library's logits against upstream's over every position of the
    throughput prefill (porter.gates.e2e.accuracy), with upstream against itself beside them.  Prints the
    figures; stores nothing; exit 0 when measured (the figures are reported, not judged), 1 when the port's
    run failed, 3 when upstream's side could not be measured."""
    import json

    from porter.gates.e2e.accuracy import accuracy_line, measure
    from porter.host import sandbox

    spec = target.spec.e2e.throughput if target.spec.e2e is not None else None
    if spec is None:
        raise PorterError(f"target {target.name} declares no [e2e.throughput] (the builds and the prefill)")
    try:
        sandbox.require()  # the engine runs the backend's host code
    except sandbox.SandboxUnavailable as exc:
        raise PorterError(str(exc)) from None
    which, lib = _library_arg(target, args, scratch)
    if lib is not None and not lib.is_file():
        raise PorterError(f"no backend library at {lib}")
    print(f"accuracy of {which} ({lib or 'the same ds4-bench on both sides'}) against upstream's ds4-bench, "
          f"logits of every position of a {spec.prefill_tokens}-token prefill")
    try:
        runner = throughput_runner(target, scratch, lib, args.model, prefill_tokens=spec.prefill_tokens,
                                   decode_tokens=spec.decode_tokens, log=print)
    except ReferenceFailure as exc:
        print(f"accuracy: not measured (upstream's engine: {exc})")
        return 3
    acc = measure(runner, runner.n_vocab, spec.prefill_tokens, log=print)
    # a KLD is read against how each side was compiled: fast math on one side only moves every logit
    acc["math_flags"] = {"upstream": UPSTREAM_MATH_FLAGS,
                         "library": "same as upstream" if lib is None else
                         " ".join(target.spec.cuda.nvcc_flags) if which == "reference" else "unknown (a prebuilt library)"}
    print(accuracy_line(acc))
    print(f"math flags: upstream's backend {acc['math_flags']['upstream']}; {which}'s {acc['math_flags']['library']}")
    print(json.dumps(acc, sort_keys=True))
    return 3 if acc.get("skipped") else 1 if acc.get("failed") else 0


def _throughput_command(target, args, scratch: Path) -> int:
    """The throughput gate on a library named by --library: a path, `reference` (every unit's slice of the
    checkout as `porter run --provider reference` ports it) or `upstream` (upstream's ds4-bench against
    itself: the A/A check, which must come out fast).  Prints the verdict; stores nothing."""
    from porter.gates.e2e.throughput_gate import run_throughput

    which, lib = _library_arg(target, args, scratch)
    print(f"throughput of {which} ({lib or 'the same ds4-bench on both sides'}) against upstream's ds4-bench")
    res = run_throughput(target, args.workspace, lib, scratch=scratch, model=args.model, log=print)
    print(res.summary)
    if res.diagnostics:
        print(res.diagnostics)
    return 0 if res.ok else 1


COMMANDS = {
    "prepare": ("write the synthetic GGUF and run every build into --scratch (the slow half of calibrate)",
                _prepare_command),
    "throughput": ("ABBA ds4-bench runs, upstream's backend against --library (a path, reference or upstream: "
                   "the A/A check), judged by porter.gates.e2e.throughput; prints the verdict",
                   _throughput_command),
    "accuracy": ("mean KL divergence and same-top-token rate of --library's logits (a path, reference or "
                 "upstream) against upstream's over every position of a 2048-token prefill, upstream against "
                 "itself beside them (porter.gates.e2e.accuracy); prints the figures", _accuracy_command),
    "logprob": ("build porter's vector driver against --library, run ds4's official logprob vectors on --model "
                "(the user's real GGUF) and judge its raw results here; stored as e2e evidence", _logprob_command),
}
