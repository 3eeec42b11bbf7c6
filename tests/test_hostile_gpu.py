"""The hostile corpus through the real gates on a GPU: each technique appended to minimoe's good
swiglu answer, compiled by the build gate (nvcc in the compiler's sandbox) and judged by parity in
CUDA mode (a pre-started sandboxed worker, the real device).  Asserts the same absences as the
host-mode corpus (tests/test_hostile.py) and, as the control, that the payload acts when the
sandbox is off.  Needs cupy, an NVIDIA GPU and nvcc: skipped with the reason otherwise."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from porter.host import sandbox
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
    from porter.gates.mutants import scripted_answers
    from porter.bench.parity import REPO, _workspace
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


def called_not_loaded(source: str, payload: str) -> str:
    """The unit with the payload run when the unit is called: the build gate refuses code that runs
    at load time (tests/test_load_time.py), and the sandbox must hold against the same code run
    from the unit's own function."""
    m = re.search(r"__attribute__\(\(constructor\)\)\s*static\s+void\s+(\w+)\(void\)", payload)
    if m:
        name, payload = m.group(1), payload.replace("__attribute__((constructor))", "", 1)
    else:  # a C++ static initialiser: the same object made on the first call
        assert "} thief;\n}" in payload
        name = "hostile_static_init"
        payload = payload.replace("} thief;\n}", "};\n}", 1) + \
            "\nstatic void hostile_static_init(void) { static Thief thief; (void)thief; }\n"
    head = re.search(rf'extern "C" int {UNIT}\([^)]*\)\s*\{{', source)
    assert head, "the good answer's definition moved"
    at = head.end()
    return (f"static void {name}(void);\n" + source[:at] + f" {name}();" + source[at:] + "\n" + payload)


def _verdict(bench_ws, technique: str, planted: dict):
    from porter.gates.extract import extract_unit_source
    from porter.gates.driver import Candidate, GateContext, ParityOptions, run_gates

    target, ws, tmp, good = bench_ws
    source = extract_unit_source(good[UNIT], UNIT, target)
    payload = (f'#define HOSTILE_OUT "{planted["outside"]}"\n#define HOSTILE_SECRET "{planted["home"] / "signing_key"}"\n'
               + (HOSTILE / f"{technique}.cu").read_text())
    cand = Candidate.of(UNIT, called_not_loaded(source, payload) + f"\n// {technique} {time.time_ns()}\n")
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


AT_LOAD = ('#include <stdlib.h>\nstatic volatile int porter_seen;\n'
           "__attribute__((constructor)) static void committed_unit_attack(void) { porter_seen = 1; abort(); }\n")


def test_a_committed_units_constructor_does_not_act_in_another_units_verdict(bench_ws):
    """add's file carries a constructor (committed before the object check refused it): it used to run in
    swiglu's parity runner, where this one kills the runner and fails an honest swiglu.  swiglu does
    not call add, so its library links add's placeholder: honest swiglu passes, a no-op still fails."""
    from porter.gates.extract import extract_unit_source
    from porter.gates.driver import Candidate, GateContext, ParityOptions, run_gates

    target, ws, tmp, good = bench_ws
    add = target.unit_path("mini_gpu_add_tensor")
    before = add.read_text() if add.is_file() else None
    add.write_text(extract_unit_source(good["mini_gpu_add_tensor"], "mini_gpu_add_tensor", target) + AT_LOAD)
    honest_src = extract_unit_source(good[UNIT], UNIT, target)
    noop_src = re.sub(rf'(extern "C" int {UNIT}\([^)]*\)\s*\{{)', r"\1 return 0;", honest_src, count=1)
    assert noop_src != honest_src
    try:
        out = {}
        for name, src in (("honest", honest_src), ("noop", noop_src)):
            ctx = GateContext(target, ws, build_cache=tmp / "cache", parity=ParityOptions(timeout=60.0))
            out[name] = {r.gate: r for r in run_gates(Candidate.of(UNIT, src + f"// {time.time_ns()}\n"), ctx,
                                                      gates=("build", "parity"))}
        assert out["honest"]["build"].evidence["linked"]["mini_gpu_add_tensor"]["role"] == "placeholder"
        assert out["honest"]["parity"].ok, out["honest"]["parity"].summary
        assert out["noop"]["build"].ok and not out["noop"]["parity"].ok and not out["noop"]["parity"].skipped
    finally:
        if before is None:
            add.unlink()
        else:
            add.write_text(before)
