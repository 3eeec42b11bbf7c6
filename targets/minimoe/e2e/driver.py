"""minimoe's e2e driver (porter.gates.e2e.target_driver): its engine linked with a backend, one prefill +
greedy decode, outputs read back.

The engine (targets/minimoe/engine.c) is compiled once; a backend is either
the CPU reference (mini_cpu.c, compiled with given flags) or a CUDA library
(porter's workspace library, or one built for calibration).  Faults from
targets/minimoe/e2e/faults.c are linked in with -Wl,--wrap.  Each run writes
the prefill logits and greedy decode logits (--logits-out) and the residual
stream after the embeddings and each layer for every prompt token
(--states-out), which porter.gates.e2e.compare reads.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from porter.digest import sha256_file
from porter.calibration.libraries import SourceLibraries, sources_from
from porter.gates.mutants import adversarial
from porter.errors import PorterError
from porter.gates.e2e import calibration as cal_mod
from porter.gates.e2e import cbuild
from porter.gates.e2e.compare import Comparison, PrefillOutputs, ReferenceFailure, compare, worst
from porter.tomlfile import read_toml

RUN_TIMEOUT_S = 120
REFERENCE_CFLAGS = ["-O2"]


@dataclass
class ModelShape:
    n_vocab: int
    n_embd: int
    n_layer: int


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_metadata(model: Path) -> dict:
    """GGUF (v2/v3) metadata key -> value; a small reader so a GPU machine needs no gguf package."""
    import struct

    with open(model, "rb") as f:
        head = f.read(1 << 20)
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from(fmt, head, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def value(t: int):
        nonlocal pos
        if t in _SCALAR:
            return take(_SCALAR[t])
        if t == 8:
            n = take("<Q")
            pos += n
            return head[pos - n:pos].decode("utf-8", "replace")
        if t == 9:
            it, n = take("<I"), take("<Q")
            return [value(it) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")

    try:
        if head[:4] != b"GGUF":
            raise ValueError("bad magic")
        pos = 8
        _n_tensors, n_kv = take("<Q"), take("<Q")
        meta = {}
        for _ in range(n_kv):
            n = take("<Q")
            key = head[pos:pos + n].decode()
            pos += n
            meta[key] = value(take("<I"))
        return meta
    except (ValueError, struct.error) as exc:
        raise PorterError(f"{model}: not a readable GGUF header ({exc})") from None


def read_shape(model: Path) -> ModelShape:
    meta = read_metadata(model)
    try:
        return ModelShape(int(meta["minimoe.vocab_size"]), int(meta["minimoe.embedding_length"]),
                          int(meta["minimoe.block_count"]))
    except KeyError as exc:
        raise PorterError(f"{model}: no metadata key {exc.args[0]} (not a minimoe GGUF)") from None


def prompt_tokens(n: int, n_vocab: int) -> list[int]:
    """A fixed prompt of n tokens that visits the vocabulary (a stride coprime to it)."""
    return [(1 + 37 * i) % n_vocab for i in range(n)]


def ensure_model(target, model: Path | None) -> Path:
    if model is not None:
        if not Path(model).is_file():
            raise PorterError(f"model {model} does not exist")
        return Path(model)
    path = target.fixture_path
    if path is None:
        raise PorterError(f"target {target.name} has no [fixture] and no --model was given")
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, str(target.fixture_script), str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise PorterError(f"{target.fixture_script.name} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return path


@dataclass
class Backend:
    """How one engine is linked: the CPU reference sources or a library, plus an optional wrap fault."""

    name: str
    cflags: list[str] | None = None  # CPU backend built with these
    library: Path | None = None  # or: a backend shared library
    fault: str | None = None  # FAULT_<fault> of faults.c
    wrap: list[str] = field(default_factory=list)


class MinimoeEngine:
    def __init__(self, target, scratch: Path, model: Path | None = None, *, n_prompt: int, n_decode: int):
        self.target = target
        self.scratch = Path(scratch)
        self.model = ensure_model(target, model)
        self.shape = read_shape(self.model)
        self.prompt = prompt_tokens(n_prompt, self.shape.n_vocab)
        self.n_decode = n_decode
        self.src = target.checkout  # engine.c, mini_cpu.c, mini_gpu.h
        self.faults = target.dir / "e2e" / "faults.c"
        self.linked: dict[Path, list[Path]] = {}  # executable -> the backend library it links

    @property
    def stage_names(self) -> list[str]:
        return ["embeddings"] + [f"layer {i}" for i in range(self.shape.n_layer)]

    def setup(self) -> dict:
        return {"model_sha256": sha256_file(self.model), "prompt": self.prompt, "decode": self.n_decode,
                "stages": self.stage_names,
                "engine_sha256": hashlib.sha256((self.src / "engine.c").read_bytes()).hexdigest(),
                "reference": "mini_cpu.c " + " ".join(REFERENCE_CFLAGS)}

    def build(self, b: Backend) -> Path:
        objs = self.scratch / "obj"
        inc = [self.src]
        engine_o = cbuild.compile_object(self.src / "engine.c", objs, ["-O2", f'-DMINI_BACKEND_NAME="{b.name}"'], inc)
        parts = [engine_o]
        if b.library is None:
            parts.append(cbuild.compile_object(self.src / "mini_cpu.c", objs, ["-fPIC", *(b.cflags or REFERENCE_CFLAGS)], inc))
        if b.fault:
            parts.append(cbuild.compile_object(self.faults, objs, ["-O2", f"-DFAULT_{b.fault}"], inc))
        exe = self.scratch / "bin" / f"minimoe-{b.name}"
        # the sandboxed run sees the executable and these; nothing else of the host's files
        self.linked[exe] = [Path(b.library).resolve()] if b.library is not None else []
        return cbuild.link(exe, parts, library=b.library, wrap=b.wrap if b.fault else [])

    def run(self, exe: Path, tag: str) -> PrefillOutputs:
        out = self.scratch / "out" / tag
        out.mkdir(parents=True, exist_ok=True)
        logits, states = out / "logits.f32", out / "states.f32"
        for p in (logits, states):
            p.unlink(missing_ok=True)
        cmd = [str(exe), str(self.model), "--prompt", ",".join(map(str, self.prompt)), "--decode", str(self.n_decode),
               "--logits-out", str(logits), "--states-out", str(states)]
        t0 = time.monotonic()
        try:
            proc = cbuild.run_engine(cmd, reads=[exe, self.model, *self.linked.get(exe, [])], writes=[out],
                                     timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PorterError(f"engine {exe.name} ran past {RUN_TIMEOUT_S}s") from None
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise PorterError(f"engine {exe.name} failed (exit {proc.returncode}): "
                              f"{(proc.stderr.strip().splitlines() or ['no message'])[-1][:300]}")
        return parse_run(proc.stdout, logits, states, self.stage_names, len(self.prompt), self.shape, self.n_decode, wall)


def greedy_tokens(logits: np.ndarray) -> list[int]:
    """The greedy token of each logits row, as engine.c's argmax picks it (the highest; on a tie the lower
    id).  A row with a non-finite value has no greedy token: -1, which no reference token equals."""
    finite = np.isfinite(logits).all(axis=1)
    return [int(t) if ok else -1 for t, ok in zip(np.argmax(np.where(np.isfinite(logits), logits, -np.inf), axis=1),
                                                  finite)]


def parse_run(stdout: str, logits_path: Path, states_path: Path, stage_names: list[str], n_prompt: int,
              shape: ModelShape, n_decode: int, wall: float | None = None) -> PrefillOutputs:
    """The engine's files, read and checked by porter; the greedy tokens are porter's argmax of the
    engine's own logits rows.  The printed `tokens:` line is a diagnostic: absent is fine, but one that
    names other tokens than those rows is an inconsistent engine (what it fed its decode steps is not
    what its logits say), a failure."""
    want_l, want_s = (1 + n_decode) * shape.n_vocab, len(stage_names) * n_prompt * shape.n_embd
    raw_l = cbuild.read_engine_output(logits_path, 4 * want_l)
    raw_s = cbuild.read_engine_output(states_path, 4 * want_s)
    if len(raw_l) != 4 * want_l or len(raw_s) != 4 * want_s:
        raise PorterError(f"engine outputs have {len(raw_l) / 4:g} logits / {len(raw_s) / 4:g} state values, "
                          f"expected {want_l} / {want_s}")
    lg = np.frombuffer(raw_l, dtype=np.float32).copy()
    st = np.frombuffer(raw_s, dtype=np.float32).copy()
    logits = lg.reshape(1 + n_decode, shape.n_vocab)
    tokens = greedy_tokens(logits)
    line = next((l for l in stdout.splitlines() if l.startswith("tokens:")), None)
    if line is not None:
        try:
            printed = [int(t) for t in line.split()[1:]]
        except ValueError:
            printed = None
        if printed is None or len(printed) != len(tokens) or any(
                t != -1 and p != t for p, t in zip(printed, tokens)):
            raise PorterError(f"the engine printed `{line[:120]}` but the argmax of its own logits rows is "
                              f"{' '.join(map(str, tokens))[:120]}: an inconsistent engine")
    return PrefillOutputs(st.reshape(len(stage_names), n_prompt, shape.n_embd), stage_names, logits, tokens, wall)


# ---------------------------------------------------------------- calibration variants

def load_variants(target) -> dict:
    return read_toml(target.dir / "e2e" / "variants.toml", why_needed="the e2e calibration's backends")


class CudaLibraries:
    """CUDA libraries for calibration: the scripted good answers, with flags, unit or glue swaps."""

    def __init__(self, target, scratch: Path):
        self.target = target
        self.scratch = Path(scratch)
        self.sources, self.origin = sources_from(target, "scripted")

    def _target_with(self, nvcc_extra: list[str] = (), glue: dict | None = None):
        from porter.target import Target

        spec = self.target.spec
        cuda = spec.cuda
        updates = {}
        if nvcc_extra:
            updates["nvcc_flags"] = [*cuda.nvcc_flags, *nvcc_extra]
        if glue:
            d = self.scratch / "glue" / hashlib.sha256(repr(sorted(glue.items())).encode()).hexdigest()[:12]
            d.mkdir(parents=True, exist_ok=True)
            for f in self.target.cuda_dir.iterdir():
                if f.is_file():
                    (d / f.name).write_bytes(f.read_bytes())
            text = (self.target.cuda_dir / glue["file"]).read_text()
            if text.count(glue["old"]) != 1:
                raise PorterError(f"glue fault: {glue['old']!r} does not occur exactly once in {glue['file']}")
            (d / glue["file"]).write_text(text.replace(glue["old"], glue["new"]))
            updates["dir"] = str(d)
        new_spec = spec.model_copy(update={"cuda": cuda.model_copy(update=updates)})
        return Target(new_spec, self.target.dir, self.target.checkout, self.target.workspace)

    def library(self, *, nvcc_extra: list[str] = (), unit: str | None = None, source: str | None = None,
                glue: dict | None = None) -> Path:
        t = self._target_with(nvcc_extra, glue)
        srcs = dict(self.sources)
        if unit:
            srcs[unit] = source
        return SourceLibraries(t, self.scratch / "cuda-cache", srcs, self.origin).library(srcs, tag=unit or "scripted")


@dataclass
class VariantPlan:
    name: str
    kind: str  # good | broken
    why: str
    backend: Backend


def plan_variants(target, mode: str, cuda: CudaLibraries | None) -> list[VariantPlan]:
    """The calibration's backends for `mode` ('cpu': CPU rows only; 'cuda': every row, faults on the CUDA base)."""
    table = load_variants(target)
    plans: list[VariantPlan] = []
    base_lib = cuda.library() if (mode == "cuda" and cuda) else None
    for kind in ("good", "broken"):
        for v in table.get(kind, []):
            if v["mode"] == "cuda" and mode != "cuda":
                continue
            name, why = v["name"], v.get("why", "")
            if "wrap" in v:
                if mode == "cuda":
                    plans.append(VariantPlan(name, kind, why, Backend(name, library=base_lib, fault=v["wrap"],
                                                                      wrap=list(v["symbols"]))))
                else:
                    plans.append(VariantPlan(name, kind, why, Backend(name, cflags=REFERENCE_CFLAGS, fault=v["wrap"],
                                                                      wrap=list(v["symbols"]))))
            elif v.get("base", "cpu") == "cpu" and "adversarial" not in v:
                plans.append(VariantPlan(name, kind, why, Backend(name, cflags=list(v.get("cflags", REFERENCE_CFLAGS)))))
            elif "adversarial" in v:
                by_file = {m.name: m for m in adversarial(target)}
                for f in v["adversarial"]:
                    m = by_file.get(f)
                    if m is None:
                        raise PorterError(f"variants.toml: adversarial file {f} is not in adversarial/manifest.toml")
                    lib = cuda.library(unit=m.unit, source=m.source)
                    plans.append(VariantPlan(f"unit:{Path(f).stem}", kind, m.why, Backend(Path(f).stem, library=lib)))
            elif "unit" in v:
                lib = cuda.library(unit=v["unit"], source=(target.dir / "e2e" / v["file"]).read_text())
                plans.append(VariantPlan(name, kind, why, Backend(name, library=lib)))
            elif "glue" in v:
                plans.append(VariantPlan(name, kind, why, Backend(name, library=cuda.library(glue=v["glue"]))))
            else:
                plans.append(VariantPlan(name, kind, why, Backend(name, library=cuda.library(
                    nvcc_extra=list(v.get("nvcc_flags", []))))))
    return plans


# ---------------------------------------------------------------- the driver interface

UNIT_SWAP_BASE = "cuda-scripted"  # the backend the adversarial units are swapped into (variants.toml)


def _engine(target, scratch: Path, model: Path | None) -> MinimoeEngine:
    spec = target.spec.e2e
    return MinimoeEngine(target, scratch, model, n_prompt=spec.prompt_tokens, n_decode=spec.decode_steps)


def prefill_pair(target, scratch: Path, library: Path, model: Path | None):
    """The gate: the CPU reference vs [e2e] runs prefills of the engine linked with `library`."""
    runs = target.spec.e2e.runs
    eng = _engine(target, scratch, model)
    try:
        ref = eng.run(eng.build(Backend("reference")), "reference")
    except PorterError as exc:
        raise ReferenceFailure(f"reference backend: {exc}") from exc
    built = eng.build(Backend("candidate", library=Path(library)))
    return ref, [eng.run(built, "candidate") for _ in range(runs)], dict(eng.setup(), runs=runs)


def calibrate(target, scratch: Path, *, mode: str = "cpu", model: Path | None = None, library: str | None = None,
              log=print) -> cal_mod.Calibration:
    """Every backend of e2e/variants.toml for `mode` ('cpu': the CPU rows; 'cuda': all, faults on the
    scripted CUDA backend) through the gate's prefill."""
    spec = target.spec.e2e
    if mode not in ("cpu", "cuda"):
        raise PorterError(f"calibration mode {mode!r} (cpu or cuda)")
    eng = _engine(target, scratch, model)
    ref = eng.run(eng.build(Backend("reference")), "reference")
    log(f"reference  mini_cpu.c -O2: {ref.wall_s:.2f}s, tokens {' '.join(map(str, ref.tokens))}")
    t0 = time.monotonic()
    cuda = CudaLibraries(target, scratch) if mode == "cuda" else None
    plans = plan_variants(target, mode, cuda)
    if cuda:
        log(f"built {len({p.backend.library for p in plans if p.backend.library})} CUDA libraries in "
            f"{time.monotonic() - t0:.1f}s")
    variants, runs = [], {}
    for p in plans:
        try:  # each backend as the gate runs a candidate: [e2e] runs prefills, the worst judged
            built = eng.build(p.backend)
            outs = [eng.run(built, p.name) for _ in range(spec.runs)]
            cand = runs[p.name] = outs[0]
            cmp, wall = worst([compare(ref, o) for o in outs]), cand.wall_s
        except PorterError as exc:
            # A backend that crashes or refuses is a measured outcome: it can never be accepted.
            cmp = Comparison(ref.stage_names, np.full(ref.states.shape[:2], np.inf), float("inf"), ref.tokens, [],
                             problem=f"run failed: {exc}")
            wall = None
        # a unit swapped into the scripted backend whose prefill equals that backend's bit for bit is wrong
        # only at shapes the engine never uses (parity's odd sizes catch it): unreached, as for ds4's mutants
        base = runs.get(UNIT_SWAP_BASE)
        cand = runs.get(p.name)
        unreached = (p.kind == "broken" and p.name.startswith("unit:") and base is not None and cand is not None
                     and np.array_equal(cand.states, base.states) and np.array_equal(cand.logits, base.logits))
        variants.append(cal_mod.Variant(p.name, p.kind, cmp, p.why, wall, unreached))
    setup = dict(eng.setup(), runs=spec.runs)
    setup["mode"] = mode
    if mode == "cuda":
        from porter.host.toolchain import driver_facts

        setup["device"] = driver_facts().get("gpu")
    return cal_mod.calibrate(variants, tokens_exact=spec.decode_steps > 0, setup=setup)


def _build_command(target, args, scratch: Path) -> int:
    eng = _engine(target, scratch, args.model)
    cuda = CudaLibraries(target, scratch) if args.mode == "cuda" else None
    plans = plan_variants(target, args.mode, cuda)
    eng.build(Backend("reference"))
    for p in plans:
        print(f"{p.kind:<7} {p.name:<40} {eng.build(p.backend)}")
    print(f"{len(plans)} variants built (nothing run)")
    return 0


COMMANDS = {
    "build": ("build every calibration backend of --mode and link the engines, run nothing (checks the plan "
              "on a machine without a GPU)", _build_command),
}
