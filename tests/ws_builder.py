"""Small workspaces for the ledger/status/audit tests, built without porter's run loop.

A workspace here is a git repository holding a copy of targets/minimoe (the
target files only, not ported/), placeholder unit files, and whatever steps a
test records: ledger records through the Ledger API, evidence through
store_evidence, and one commit per step written with gitpython directly, with
the trailers porter's loop writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import git

from porter.records import signing
from porter.records.evidence import store_evidence
from porter.digest import sha256_bytes
from porter.records.ledger import Ledger
from porter.target import load_target
from porter.workspace import MARKER, MARKER_TEXT

REPO = Path(__file__).resolve().parents[1]
TARGET = "minimoe"

# Real (if small) ports that any sane static gate accepts.
SOURCES = {
    "mini_gpu_synchronize": """#include "mini_cuda.cuh"

extern "C" int mini_gpu_synchronize(void) {
    return mini_cuda_check(cudaStreamSynchronize(mini_cuda_stream()), "synchronize");
}
""",
    "mini_gpu_tensor_bytes": """#include "mini_cuda.cuh"

extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {
    return tensor != NULL ? tensor->bytes : 0;
}
""",
    "mini_gpu_swiglu_tensor": """#include "mini_cuda.cuh"

static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int mini_gpu_swiglu_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *gate,
                                      const mini_gpu_tensor *up, uint64_t n) {
    if (!out || !gate || !up) return -1;
    if (n * sizeof(float) > out->bytes || n * sizeof(float) > gate->bytes || n * sizeof(float) > up->bytes) return -1;
    if (n == 0) return 0;
    unsigned blocks = (unsigned)((n + 255) / 256);
    swiglu_kernel<<<blocks, 256, 0, mini_cuda_stream()>>>((float *)out->data, (const float *)gate->data,
                                                         (const float *)up->data, n);
    return MINI_CUDA_LAUNCH_OK("swiglu") ? 0 : -1;
}
""",
    "mini_gpu_add_tensor": """#include "mini_cuda.cuh"

static __global__ void add_kernel(float *out, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a,
                                   const mini_gpu_tensor *b, uint64_t n) {
    if (!out || !a || !b) return -1;
    if (n * sizeof(float) > out->bytes || n * sizeof(float) > a->bytes || n * sizeof(float) > b->bytes) return -1;
    if (n == 0) return 0;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>((float *)out->data,
        (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
}
""",
}

STUB = {
    "mini_gpu_swiglu_tensor": """#include "mini_cuda.cuh"

extern "C" int mini_gpu_swiglu_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *gate,
                                      const mini_gpu_tensor *up, uint64_t n) {
    (void)out; (void)gate; (void)up; (void)n;
    return -1;
}
""",
}


def placeholder(unit: str) -> str:
    return f'// porter:placeholder\n#include "mini_cuda.cuh"\n// {unit} is not ported yet\n'


class Workspace:
    def __init__(self, root: Path, key: bytes | None = None, signer=None):
        self.root = Path(root)
        self.key = key
        self.signer = signer
        self.repo = git.Repo(self.root)
        self.target = load_target(self.root, TARGET)
        self.ledger = Ledger(self.root, key, signer)

    # -- files --
    def unit_path(self, unit: str) -> Path:
        return self.target.unit_path(unit)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def write_unit(self, unit: str, text: str) -> str:
        self.unit_path(unit).write_text(text)
        return sha256_bytes(text.encode())

    # -- ledger --
    def attempt(self, unit: str, attempt: int, source: str | None, run: str = "run-1") -> dict:
        return self.ledger.append(
            "attempt",
            target=TARGET,
            unit=unit,
            attempt=attempt,
            run=run,
            provider="scripted",
            model="scripted",
            prompt_sha256=sha256_bytes(f"prompt {unit} {attempt}".encode()),
            response_sha256=sha256_bytes(f"response {unit} {attempt}".encode()),
            candidate_sha256=sha256_bytes(source.encode()) if source is not None else None,
            usage={"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        )

    def gate(self, unit: str, attempt: int, gate: str, ok: bool, candidate: str | None, summary: str = "", **facts) -> tuple[dict, str]:
        ev = store_evidence(
            self.root,
            {
                "target": TARGET,
                "unit": unit,
                "gate": gate,
                "ok": ok,
                "candidate_sha256": candidate,
                "toolchain": {"nvcc": "test", "gpu": "none"},
                **facts,
            },
        )
        rec = self.ledger.append(
            "gate", target=TARGET, unit=unit, attempt=attempt, gate=gate, ok=ok, skipped=False,
            summary=summary or f"{gate} {'ok' if ok else 'failed'}", evidence=ev,
        )
        return rec, ev

    def fail(self, unit: str, attempt: int, gate: str = "build", summary: str = "nvcc: error: expected ';'",
             source: str = "// broken\n", diagnostics: str | None = None, facts: dict | None = None) -> None:
        self.attempt(unit, attempt, source)
        cand = sha256_bytes(source.encode())
        if gate != "extract":
            self.gate(unit, attempt, gate, False, cand, summary, **(facts or {}))
        diag_sha = None
        if diagnostics is not None:
            diag_sha = sha256_bytes(diagnostics.encode())
            d = self.root / "runs" / "diagnostics"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{diag_sha}.txt").write_text(diagnostics)
        self.ledger.append("failure", target=TARGET, unit=unit, attempt=attempt, gate=gate, summary=summary,
                           diagnostics=diag_sha)

    def exhaust(self, unit: str, attempts: int) -> None:
        self.ledger.append("exhausted", target=TARGET, unit=unit, attempts=attempts)

    def port(self, unit: str, attempt: int = 1, state: str = "verified", source: str | None = None,
             commit: bool = True, perf: bool = True, sandbox: str = "bubblewrap 0.8.0",
             toolchain: dict | None = None, timing: dict | None = None,
             perf_facts: dict | None = None, parity_facts: dict | None = None) -> tuple[dict, str | None]:
        """One successful attempt: unit file, gate records, evidence, step record and its commit.
        `timing`: parity's timed case (with a regime); `perf_facts`: the perf evidence's facts."""
        source = source if source is not None else SOURCES[unit]
        cand = self.write_unit(unit, source)
        self.attempt(unit, attempt, source)
        evidence = []
        verified = ("parity",) + (("perf",) if perf else ()) if state == "verified" else ()
        for gate in ("static", "build") + verified:
            facts = {"library": "runs/build/libmini_cuda.so"} if gate == "build" else {}
            if gate == "parity":
                facts = {"seeds": [11, 12], "metrics": {"nmse": 1e-9}, "sandbox": sandbox,
                         **({"toolchain": toolchain} if toolchain else {})}
                if timing is not None:
                    facts.update(timing=timing, regime={"name": timing.get("regime", "device")})
                facts.update(parity_facts or {})
            if gate == "perf":
                facts = perf_facts or {"ratio": 1.2}
            _, ev = self.gate(unit, attempt, gate, True, cand, **facts)
            evidence.append(ev)
        step = self.ledger.append(
            "step", target=TARGET, unit=unit, attempt=attempt, state=state, candidate_sha256=cand,
            unit_file=self.rel(self.unit_path(unit)), evidence=evidence,
        )
        sha = self.commit_step(step) if commit else None
        return step, sha

    def step_message(self, step: dict, evidence: list[str] | None = None) -> str:
        lines = [
            f"porter: {step['state']} {step['unit']} (attempt {step['attempt']})",
            "",
            f"Porter-Unit: {step['unit']}",
            f"Porter-Target: {TARGET}",
            f"Porter-State: {step['state']}",
            f"Porter-Candidate: {step['candidate_sha256']}",
            f"Porter-Step: {step['hash']}",
        ]
        lines += [f"Porter-Evidence: {e}" for e in (evidence if evidence is not None else step["evidence"])]
        return "\n".join(lines) + "\n"

    def commit_step(self, step: dict) -> str:
        paths = [step["unit_file"], "ledger/ledger.jsonl"] + [f"ledger/evidence/{e}.json" for e in step["evidence"]]
        self.repo.index.add(paths)
        return self.repo.index.commit(self.step_message(step)).hexsha

    def commit_all(self, message: str) -> str:
        self.repo.git.add("-A")
        return self.repo.index.commit(message).hexsha


def make_workspace(root: Path, key: bytes | None = None, signer=None) -> Workspace:
    """A fresh workspace: minimoe target files, placeholders for every unit, one commit.
    With a porter.records.signing.Signer its public key is ledger/signer.pub and every record is signed."""
    root = Path(root)
    dst = root / "targets" / TARGET
    shutil.copytree(
        REPO / "targets" / TARGET,
        dst,
        ignore=shutil.ignore_patterns("ported", "__pycache__", "*.o", "*.so", "*.gguf"),
    )
    (root / "runs").mkdir()
    (root / ".gitignore").write_text("runs/\n")
    (root / MARKER).write_text(MARKER_TEXT)  # as `porter init` marks the workspaces it makes
    repo = git.Repo.init(root)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "porter-test")
        cw.set_value("user", "email", "porter-test@localhost")
    if signer is not None:
        signing.write_workspace_key(root, signer)
    ws = Workspace(root, key, signer)
    ws.target.ported_dir.mkdir(parents=True, exist_ok=True)
    for unit in ws.target.units:
        ws.write_unit(unit, placeholder(unit))
    ws.commit_all("porter init")
    return ws
