"""Hostile candidates through the real parity gate (host mode: the C stand-in backend, no GPU).

Each file in tests/hostile/ named below is one technique a candidate's host code can use the
moment its library is loaded.  Linked into an otherwise honest stand-in backend, each runs
through run_spec (pool -> pre-started sandboxed worker -> load -> calls), and the test asserts
the ABSENCE of its effects: no file written outside the plan folder, no secret byte (a planted
signing key under $PORTER_HOME, fake API keys in the environment) in the gate's summary,
diagnostics, evidence or any file the run left, no process left behind, and the next
candidates judged as before (an honest one passes, a broken one fails).  The same candidate
with --unsafe-no-sandbox shows each effect does happen without the sandbox: it is the sandbox
that stops it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from porter.host import sandbox
from porter.gates.parity import executors, pool
from porter.gates.parity.gate import run_spec
from porter.spec import load_spec

from tests.test_parity_compare import FAKE_BACKEND, fixture_ctx, target  # noqa: F401  (fixtures)

HOSTILE = Path(__file__).resolve().parent / "hostile"
CC, CXX = shutil.which("cc") or shutil.which("gcc"), shutil.which("g++") or shutil.which("c++")
pytestmark = [pytest.mark.skipif(CC is None or CXX is None, reason="no C/C++ compiler"),
              pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")]

UNIT = "mini_gpu_swiglu_tensor"
DAEMON_NAME = "hostiledaemon"
# technique -> files its payload leaves in the outside folder when nothing stops it
EFFECTS = {
    "constructor_system": ["constructor_system.env", "constructor_system.key"],
    "static_init_reads_porter_home": ["static_init.key"],
    "dlsym_interpreter": ["dlsym_interpreter.marker"],
    "raw_syscall": ["raw_syscall.marker"],
    "daemon_outlives_job": ["daemon.marker"],
    "inherited_fds": ["inherited_fds.marker"],
    "read_parent_memory": ["read_parent_memory.environ", "read_parent_memory.mem-readable"],
}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A signing key under this test's $PORTER_HOME, provider keys in the environment, an outside folder."""
    home = Path(os.environ["PORTER_HOME"])  # conftest: tmp_path/porter-home
    home.mkdir(parents=True, exist_ok=True)
    key = f"PORTER-FAKE-SIGNING-KEY-{secrets.token_hex(16)}"
    (home / "signing_key").write_text(key)
    api = {"ANTHROPIC_API_KEY": f"sk-ant-fake-{secrets.token_hex(12)}",
           "OPENAI_API_KEY": f"sk-fake-{secrets.token_hex(12)}"}
    for k, v in api.items():
        monkeypatch.setenv(k, v)
    outside = tmp_path / "outside"
    executors.shutdown()
    yield {"key": key, "api": list(api.values()), "outside": outside, "home": home}
    executors.shutdown()
    _kill_daemons()


def _daemons() -> list[int]:
    out = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == DAEMON_NAME:
                out.append(int(comm.parent.name))
        except OSError:
            continue
    return out


def _kill_daemons() -> None:
    for pid in _daemons():  # only the daemon this module's candidate started, by its pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def next_candidates(tmp_path_factory) -> dict:
    """The candidates judged after a hostile one: an honest backend and one that leaves its output untouched."""
    d = tmp_path_factory.mktemp("next")
    return {"honest": _build(d, None, {}), "broken": _build(d, None, {}, ("HACK_UNTOUCHED",))}


def _build(tmp_path: Path, technique: str | None, planted: dict, defines: tuple = ()) -> Path:
    d = tmp_path / "build" / (technique or "plain") / ("-".join(defines) or "as-is")
    d.mkdir(parents=True)
    (d / "backend.c").write_text(FAKE_BACKEND)
    objs = [d / "backend.o"]
    subprocess.run([CC, "-O1", "-fPIC", *[f"-D{x}" for x in defines], "-c", "-o", str(objs[0]), str(d / "backend.c")],
                   check=True)
    if technique:
        objs.append(d / "hostile.o")
        subprocess.run([CXX, "-x", "c++", "-O1", "-fPIC", f'-DHOSTILE_OUT="{planted["outside"]}"',
                        f'-DHOSTILE_SECRET="{planted["home"] / "signing_key"}"', "-c", "-o", str(objs[1]),
                        str(HOSTILE / f"{technique}.cu")], check=True)
    lib = d / "libbackend.so"
    subprocess.run([CXX, "-shared", "-o", str(lib), *map(str, objs), "-lm", "-ldl"], check=True)
    return lib


def _parity(target, ctx, lib: Path, ws: Path):
    return run_spec(target, load_spec(target, UNIT), lib, workspace=ws, mode="host", ctx=ctx, timing_reps=2, keep=True)


def _everything_written(res, ws: Path) -> bytes:
    blob = [res.summary.encode(), (res.diagnostics or "").encode(), json.dumps(res.evidence).encode()]
    blob += [p.read_bytes() for p in ws.rglob("*") if p.is_file() and not p.is_symlink()]
    return b"\n".join(blob)


@pytest.mark.parametrize("technique", sorted(EFFECTS))
def test_the_sandbox_stops_it(technique, target, fixture_ctx, tmp_path, planted, next_candidates):
    ws = tmp_path / "ws"
    res = _parity(target, fixture_ctx, _build(tmp_path, technique, planted), ws)
    assert res.evidence["sandbox"] == sandbox.version()
    # no daemon alive once the verdict is in (the pid namespace's end reaps it before bwrap exits): one that
    # is not alive now can never act, so what is written outside is final without waiting for its 3 s
    assert _daemons() == [], f"{technique}: a process outlived its job"
    written = sorted(str(p.relative_to(planted["outside"])) for p in planted["outside"].rglob("*")) \
        if planted["outside"].exists() else []
    assert written == [], f"{technique} wrote outside its plan folder: {written}"
    blob = _everything_written(res, ws)
    for secret in [planted["key"], *planted["api"]]:
        assert secret.encode() not in blob, f"{technique}: a secret reached the gate's output or files"
    if technique == "inherited_fds":  # exits 0 at load with a forged 'complete' results file
        assert not res.ok and "not believed" in res.summary + res.diagnostics, res.summary
    # the next candidates are judged as ever: no state of the hostile one survived
    honest = _parity(target, fixture_ctx, next_candidates["honest"], tmp_path / "ws2")
    assert honest.ok, honest.summary
    broken = _parity(target, fixture_ctx, next_candidates["broken"], tmp_path / "ws3")
    assert not broken.ok and "[sentinel]" in broken.summary, broken.summary


@pytest.mark.parametrize("technique", sorted(EFFECTS))
def test_without_the_sandbox_it_works(technique, target, fixture_ctx, tmp_path, planted, monkeypatch):
    """The control: --unsafe-no-sandbox, same candidate, same gate, and the payload does what it says."""
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    res = _parity(target, fixture_ctx, _build(tmp_path, technique, planted), tmp_path / "ws")
    assert res.evidence.get("sandbox") == "none", res.summary + res.diagnostics
    deadline = time.monotonic() + 8
    want = [planted["outside"] / f for f in EFFECTS[technique]]
    while not all(p.exists() and p.stat().st_size >= 0 for p in want) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(p.exists() for p in want), f"{technique} had no effect even unsandboxed: {os.listdir(planted['outside']) if planted['outside'].exists() else []}"
    loot = b"".join(p.read_bytes() for p in want)
    if technique == "constructor_system":
        assert planted["api"][0].encode() in loot  # the provider keys were there for the taking
    if technique in ("constructor_system", "static_init_reads_porter_home"):
        assert planted["key"].encode() in loot  # and so was the signing key
    if technique == "daemon_outlives_job":
        assert _daemons(), "unsandboxed, the daemon outlives its job"


@pytest.mark.parametrize("scrubbed", [True, False])
def test_a_link_left_in_the_plan_folder_is_not_followed(scrubbed, target, fixture_ctx, tmp_path, planted, monkeypatch):
    """The sandbox cannot stop this one: the link is made where the candidate may write, and followed
    by the parent outside.  runner.scrub does: without it the key lands in the gate's summary."""
    from porter.gates.parity import runner

    if not scrubbed:
        monkeypatch.setattr(runner, "scrub", lambda plan_dir: None)
    res = _parity(target, fixture_ctx, _build(tmp_path, "symlink_to_secret", planted), tmp_path / "ws")
    assert not res.ok
    leaked = planted["key"].encode() in res.summary.encode() + (res.diagnostics or "").encode()
    assert leaked != scrubbed, res.summary


@pytest.mark.parametrize("guarded", [True, False])
def test_a_plan_folder_swapped_for_a_link_is_not_taken_back(guarded, target, fixture_ctx, tmp_path, planted,
                                                            monkeypatch):
    """The pre-started worker's plan folder sits in a slot the candidate may write; a link it leaves in
    the folder's place must not become the gate's plan folder (the parent would read and write through it)."""
    if not guarded:
        monkeypatch.setattr(pool.Standby, "_unstage", staticmethod(lambda staged, plan_dir, moved:
                                                                   os.rename(staged, plan_dir)))
    ws = tmp_path / "ws"
    res = _parity(target, fixture_ctx, _build(tmp_path, "replace_plan_folder", planted), ws)
    assert not res.ok
    links = [p.name for p in (ws / "runs" / "parity").iterdir() if p.is_symlink()]
    assert (links == []) == guarded, links
