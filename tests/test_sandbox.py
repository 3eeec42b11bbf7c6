"""porter.host.sandbox: what a sandboxed process can and cannot see (bubblewrap, no GPU needed)."""

import os
import subprocess
import sys

import pytest

from porter.host import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")


def _run(code: str, **kw) -> subprocess.CompletedProcess:
    w = sandbox.wrap([sys.executable, "-c", code], **kw)
    return subprocess.run(w.argv, env=w.env, capture_output=True, text=True, timeout=60)


def test_inside_sees_no_home_no_secrets_no_network_and_no_caps(tmp_path, monkeypatch):
    home = tmp_path / "porter-home"
    home.mkdir()
    (home / "signing_key").write_text("SECRET-KEY-BYTES")
    monkeypatch.setenv("PORTER_HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-FAKE")
    plan = tmp_path / "plan"
    plan.mkdir()
    p = _run("import os, socket, numpy\n"
             f"print(os.path.exists({str(home)!r}), os.path.exists({os.path.expanduser('~/.bashrc')!r}))\n"
             "print(sorted(os.environ))\n"
             "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')])\n"
             "s = socket.socket()\n"
             "try:\n    s.connect(('1.1.1.1', 53)); print('net')\nexcept OSError: print('no net')\n"
             "open('written', 'w').write('x')\n", rw=[str(plan)])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "False False"
    assert "ANTHROPIC_API_KEY" not in lines[1] and "PORTER_HOME" not in lines[1]
    assert lines[2] == "['0000000000000000']"
    assert lines[3] == "no net"
    assert (plan / "written").read_text() == "x"  # the rw folder is the way out, and the only one


def test_a_read_only_folder_below_tmp_is_visible(tmp_path):
    """/tmp's tmpfs is mounted before the binds: a read-only folder below /tmp (a target's headers in a
    test workspace, as the compiler's sandbox binds them) was hidden under it."""
    headers = tmp_path / "headers"
    headers.mkdir()
    (headers / "api.h").write_text("int f(void);")
    (tmp_path / "plan").mkdir()
    p = _run(f"print(open({str(headers / 'api.h')!r}).read())", ro=[str(headers)], rw=[str(tmp_path / "plan")])
    assert p.returncode == 0 and p.stdout.strip() == "int f(void);", p.stderr


def test_a_bind_that_exposes_home_or_porter_home_is_refused(tmp_path, monkeypatch):
    """The check that keeps the signing key out: fails open if a caller binds a folder above it."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path / "ph"))
    (tmp_path / "ph" / "sub").mkdir(parents=True)
    for bad in (tmp_path, tmp_path / "ph", tmp_path / "ph" / "sub", os.path.expanduser("~")):
        with pytest.raises(sandbox.SandboxUnavailable, match="refusing to show"):
            sandbox.wrap(["true"], rw=[str(bad)])


@pytest.mark.parametrize("unsafe", [False, True])
def test_a_daemon_dies_with_the_sandbox(tmp_path, monkeypatch, unsafe):
    """setsid + sleep inside: bwrap's init is pid 1 of the namespace, so the daemon ends with the command
    (and without the sandbox it outlives it: the sandbox is what stops it)."""
    if unsafe:
        monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    import select

    out = tmp_path / "plan"  # tmp_path itself holds the test's $PORTER_HOME (conftest)
    out.mkdir()
    alive = out / "alive"
    os.mkfifo(alive)
    os.chmod(alive, 0o666)  # the sandbox runs as an unprivileged uid of its own
    # the daemon holds the FIFO's write end: reading sees EOF once it is gone, or its 'x' if it lived to
    # write it -- no sleep to outwait it
    rfd = os.open(alive, os.O_RDONLY | os.O_NONBLOCK)
    try:
        p = _run("import os, time\n"
                 f"w = os.open({str(alive)!r}, os.O_WRONLY)\n"
                 "if os.fork() == 0:\n    os.setsid()\n    time.sleep(1.5)\n    os.write(w, b'x')\n    os._exit(0)\n",
                 rw=[str(out)])
        assert p.returncode == 0, p.stderr
        os.set_blocking(rfd, True)
        assert select.select([rfd], [], [], 60)[0], "the daemon neither died nor wrote"  # a hang guard only
        assert os.read(rfd, 1) == (b"x" if unsafe else b"")
    finally:
        os.close(rfd)


def test_limits_are_hard_inside(tmp_path):
    p = _run("import resource\nprint(resource.getrlimit(resource.RLIMIT_CORE), "
             "resource.getrlimit(resource.RLIMIT_FSIZE)[1])", limits=sandbox.Limits(file_size=1 << 20))
    assert p.stdout.split("\n")[0] == f"(0, 0) {1 << 20}", p.stderr


def test_unavailable_says_what_is_missing_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox.available.cache_clear()
    try:
        ok, why = sandbox.available()
        assert not ok and why == "bwrap not found: apt-get install bubblewrap"
        with pytest.raises(sandbox.SandboxUnavailable, match="bwrap not found.*--unsafe-no-sandbox"):
            sandbox.wrap(["true"])
        monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
        unsafe = sandbox.wrap(["true"]).argv  # the command as it is, behind prlimit's limits only
        assert unsafe[-2:] == ["--", "true"] and not any("bwrap" in a for a in unsafe) and sandbox.label() == "none"
    finally:
        sandbox.available.cache_clear()


def test_parity_refuses_in_one_line_without_the_sandbox(monkeypatch):
    """The harness's lack is a refusal that names the fix, never a verdict on the candidate."""
    from types import SimpleNamespace

    from porter.gates import parity

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox.available.cache_clear()
    try:
        ctx = SimpleNamespace(target=None, parity=SimpleNamespace(mode="host"), library="/nonexistent/lib.so")
        res = parity.run(SimpleNamespace(unit="u"), ctx)
    finally:
        sandbox.available.cache_clear()
    assert res.skipped and not res.ok
    assert res.summary == ("parity refused: cannot sandbox candidate code: bwrap not found: "
                           "apt-get install bubblewrap (or pass --unsafe-no-sandbox)")


def test_no_python_runs_between_fork_and_exec():
    """porter run forks compilers and parity children from several threads at once; a preexec_fn (Python
    code in the forked child) deadlocked there on an H100 (the build's chains hung in _execute_child until
    the run's time limit).  Limits are set by prlimit(1) in front of the command instead."""
    import ast
    from pathlib import Path

    root = Path(sandbox.__file__).resolve().parent
    offenders = [f"{p.relative_to(root.parent)}:{node.lineno}"
                 for p in root.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, ast.keyword) and node.arg == "preexec_fn"]
    assert offenders == []
    w = sandbox.wrap(["true"])
    assert w.argv[0].endswith("prlimit") and "--core=0:0" in w.argv


def _inside_cuda_devices(argv: list[str]) -> list[str]:
    return [argv[i + 2] for i, a in enumerate(argv[:-2]) if a == "--setenv" and argv[i + 1] == "CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("gpu_index,env", [(1, {}), (None, {"CUDA_VISIBLE_DEVICES": "1"})])
def test_one_gpu_shown_is_device_zero_inside(monkeypatch, gpu_index, env):
    # measured on a two-H200 host: with only /dev/nvidia1 shown, CUDA_VISIBLE_DEVICES=1 inside made
    # cuInit fail (no device) and every check on the second GPU a harness error; CUDA numbers the
    # nodes it can open, so the one shown is device 0
    shown = []
    monkeypatch.setattr(sandbox, "gpu_devices", lambda index=None: shown.append(index) or ["/dev/null"])
    argv = sandbox.wrap(["true"], gpu=True, gpu_index=gpu_index, env=env).argv
    assert shown == [1]
    assert _inside_cuda_devices(argv) == ["0"]


def test_every_gpu_shown_keeps_the_device_selection_unset(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sandbox, "gpu_devices", lambda index=None: ["/dev/null"])
    assert _inside_cuda_devices(sandbox.wrap(["true"], gpu=True).argv) == []
