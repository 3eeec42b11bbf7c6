"""The hostile corpus through the real gates on a GPU: each technique appended to minimoe's good
swiglu answer, compiled by the build gate (nvcc in the compiler's sandbox) and judged by parity in
CUDA mode (a pre-started sandboxed worker, the real device).  Asserts the same absences as the
host-mode corpus (tests/test_hostile.py) and, as the control, that the payload acts when the
sandbox is off.  Needs cupy, an NVIDIA GPU and nvcc: skipped with the reason otherwise."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from porter import sandbox
from porter.gates.parity import available, executors

from tests.test_hostile import EFFECTS, HOSTILE, _daemons, planted  # noqa: F401  (fixture)

_ok, _why = available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _ok, reason=f"parity gate unavailable here: {_why}"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH"),
              pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")]

UNIT = "mini_gpu_swiglu_tensor"


@pytest.fixture(scope="module")
def bench_ws():
    from porter.calibration.mutants import scripted_answers
    from porter.gates.parity.bench import REPO, _workspace
    from porter.target import load_target
    from porter.workspace import example_target

    tmp = Path(tempfile.mkdtemp(prefix="porter-hostile-gpu-"))
    name = example_target()
    ws = _workspace(REPO, tmp, name)
    target = load_target(ws, name)
    good = {a["unit"]: (target.scripted_dir / a["file"]).read_text()
            for a in scripted_answers(target) if a["expect"] == "pass"}
    target.ported_dir.mkdir(parents=True, exist_ok=True)
    yield target, ws, tmp, good
    executors.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _verdict(bench_ws, technique: str, planted: dict):
    from porter.extract import extract_unit_source
    from porter.gates.driver import Candidate, GateContext, ParityOptions, run_gates

    target, ws, tmp, good = bench_ws
    source = extract_unit_source(good[UNIT], UNIT, target)
    payload = (f'#define HOSTILE_OUT "{planted["outside"]}"\n#define HOSTILE_SECRET "{planted["home"] / "signing_key"}"\n'
               + (HOSTILE / f"{technique}.cu").read_text())
    cand = Candidate.of(UNIT, source + "\n" + payload + f"\n// {technique} {time.time_ns()}\n")
    ctx = GateContext(target, ws, build_cache=tmp / "cache", parity=ParityOptions(timeout=60.0))
    return {r.gate: r for r in run_gates(cand, ctx, gates=("build", "parity"))}


@pytest.mark.parametrize("technique", sorted(EFFECTS))
def test_the_sandbox_stops_it_on_the_gpu(technique, bench_ws, planted):
    res = _verdict(bench_ws, technique, planted)
    assert res["build"].ok, res["build"].summary + res["build"].diagnostics
    assert "parity" in res and not res["parity"].skipped, res.get("parity")
    assert res["parity"].evidence.get("sandbox") == sandbox.version()
    time.sleep(4 if technique == "daemon_outlives_job" else 0)
    outside = planted["outside"]
    written = sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) if outside.exists() else []
    assert written == [], f"{technique} wrote outside its plan folder: {written}"
    text = "\n".join(r.summary + (r.diagnostics or "") + repr(r.evidence) for r in res.values())
    for secret in [planted["key"], *planted["api"]]:
        assert secret not in text
    assert _daemons() == []


@pytest.mark.parametrize("technique", ["constructor_system", "static_init_reads_porter_home"])
def test_without_the_sandbox_it_works_on_the_gpu(technique, bench_ws, planted, monkeypatch):
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    res = _verdict(bench_ws, technique, planted)
    assert res["build"].ok, res["build"].summary
    want = [planted["outside"] / f for f in EFFECTS[technique]]
    assert all(p.exists() for p in want), f"{technique} had no effect unsandboxed"
    assert planted["key"].encode() in b"".join(p.read_bytes() for p in want)
