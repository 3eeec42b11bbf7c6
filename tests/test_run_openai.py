"""End to end through the real openai provider: `porter run --provider openai
--base-url http://127.0.0.1:PORT/v1 --unit mini_gpu_swiglu_tensor` on a fresh
workspace, against the fake server serving the known-good answer.  The unit is
built with the real nvcc (and verified where a GPU makes parity available), the
call's usage lands in the ledger, and the API key appears nowhere in the
workspace: not in the ledger, runs/, the git history or any file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_llm_server import FakeLLMServer, Reply  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_swiglu_tensor"
GOOD = REPO / "targets" / "minimoe" / "scripted" / "good" / f"{UNIT}.md"
KEY = "sk-porter-e2e-SECRET-5f1c9a7e3b"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: the build gate compiles for real"),
]


def _porter(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porter", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def env() -> dict:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PORTER_", "OPENAI_", "ANTHROPIC_"))}
    e["PORTER_OPENAI_API_KEY"] = KEY
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    return e


@pytest.fixture
def workspace(tmp_path, env) -> Path:
    ws = tmp_path / "ws"
    r = _porter("init", str(ws), "--target", "minimoe", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return ws


def _records(ws: Path) -> list[dict]:
    return [json.loads(line) for line in (ws / "ledger" / "ledger.jsonl").read_text().splitlines() if line.strip()]


def _files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if needle in p.read_bytes():
                    hits.append(str(p.relative_to(root)))
            except OSError:
                pass
    return hits


def test_run_openai_completes_a_unit_end_to_end(workspace, env):
    assert GOOD.is_file(), f"the known-good answer {GOOD} is missing"
    answer = GOOD.read_text()
    with FakeLLMServer(default=Reply.answer(answer, usage=(2345, 678)), lifetime_s=600) as srv:
        r = _porter("-C", str(workspace), "run", "--target", "minimoe", "--provider", "openai",
                    "--base-url", srv.openai_url, "--unit", UNIT, "--max-attempts", "1",
                    "--price-input", "3", "--price-output", "15", env=env)
        requests = list(srv.requests)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"

    # exactly one completion was asked for (plus the model discovery), with the key and the real prompt
    chats = [q for q in requests if q.path == "/v1/chat/completions"]
    assert len(chats) == 1
    assert chats[0].headers.get("authorization") == f"Bearer {KEY}"
    body = chats[0].body
    assert body["model"] == "fake-local-model"
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert "No caching between calls" in system
    assert f"extern \"C\" int {UNIT}(mini_gpu_tensor *out, const mini_gpu_tensor *gate" in user
    assert "kernel_swiglu_f32" in user  # the Metal slice

    recs = _records(workspace)
    usage = [x for x in recs if x["kind"] == "usage"]
    assert len(usage) == 1
    u = usage[0]
    assert (u["unit"], u["provider"], u["model"]) == (UNIT, "openai", "fake-local-model")
    assert (u["input_tokens"], u["output_tokens"]) == (2345, 678)
    assert u["cost_usd"] == pytest.approx(2345 * 3 / 1e6 + 678 * 15 / 1e6)
    attempt = [x for x in recs if x["kind"] == "attempt" and x["unit"] == UNIT]
    assert len(attempt) == 1 and attempt[0]["provider"] == "openai"
    steps = [x for x in recs if x["kind"] == "step" and x["unit"] == UNIT]
    assert len(steps) == 1 and steps[0]["state"] in ("built", "verified")
    log = subprocess.run(["git", "log", "--format=%s"], cwd=workspace, capture_output=True, text=True).stdout
    assert f"porter: {steps[0]['state']} {UNIT} (attempt 1)" in log
    unit_file = workspace / "targets" / "minimoe" / "ported" / f"{UNIT}.cu"
    assert "swiglu_kernel<<<" in unit_file.read_text()

    # the key is nowhere in the workspace: files, ledger, runs/, git objects (loose and packed)
    subprocess.run(["git", "gc", "-q"], cwd=workspace, capture_output=True)
    assert _files_containing(workspace, KEY.encode()) == []
    assert KEY not in r.stdout and KEY not in r.stderr


def test_run_openai_bad_key_stops_the_run_in_one_line(workspace, env):
    with FakeLLMServer(default=Reply.error(401, f"Incorrect API key provided: {KEY}")) as srv:
        r = _porter("-C", str(workspace), "run", "--target", "minimoe", "--provider", "openai",
                    "--base-url", srv.openai_url, "--model", "m", "--unit", UNIT, env=env, timeout=300)
        chats = [q for q in srv.requests if q.path == "/v1/chat/completions"]
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(chats) == 1  # no retry on bad credentials
    out = r.stdout + r.stderr
    assert "authentication failed (HTTP 401)" in out and "OPENAI_API_KEY" in out
    assert KEY not in out
    assert _files_containing(workspace, KEY.encode()) == []
