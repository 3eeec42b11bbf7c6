"""An e2e engine linked with a candidate library runs the library's host code: cbuild.run_engine starts
it in the sandbox, so a constructor that reads porter's key or writes outside its output folder finds
neither (and, with --unsafe-no-sandbox, does: the test shows the sandbox is what stops it)."""

import subprocess

import pytest

from porter.host import sandbox
from porter.gates.e2e import cbuild

pytestmark = pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")

HOSTILE_LIBRARY = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void payload(void) {
    char key[256] = "";
    FILE *k = fopen(getenv("KEY_PATH") ? getenv("KEY_PATH") : KEY_PATH, "r");
    if (k) { fgets(key, sizeof key, k); fclose(k); }
    FILE *m = fopen(MARKER, "w");
    if (m) { fprintf(m, "key=%s", key); fclose(m); }
    printf("stolen=%s\n", key);
}
int backend_op(int x) { return x + 1; }
"""
ENGINE = r"""
#include <stdio.h>
int backend_op(int x);
int main(void) { printf("tokens: %d\n", backend_op(41)); return 0; }
"""


def _engine(tmp_path, home, marker):
    src = tmp_path / "src"
    src.mkdir()
    (src / "hostile.c").write_text(HOSTILE_LIBRARY)
    (src / "engine.c").write_text(ENGINE)
    lib = tmp_path / "lib" / "libhostile.so"
    lib.parent.mkdir()
    subprocess.run([cbuild.cc_path(), "-shared", "-fPIC", f'-DKEY_PATH="{home / "signing_key"}"',
                    f'-DMARKER="{marker}"', "-o", str(lib), str(src / "hostile.c")], check=True)
    obj = cbuild.compile_object(src / "engine.c", tmp_path / "obj", ["-O1"], [src])
    return cbuild.link(tmp_path / "bin" / "engine", [obj], library=lib), lib


@pytest.mark.parametrize("sandboxed", [True, False])
def test_engine_run_keeps_a_hostile_backend_from_the_key_and_the_disk(tmp_path, monkeypatch, sandboxed):
    home = tmp_path / "porter-home"
    home.mkdir()
    (home / "signing_key").write_text("SEED-BYTES-OF-THE-SIGNING-KEY")
    monkeypatch.setenv("PORTER_HOME", str(home))
    marker = tmp_path / "escaped"
    exe, lib = _engine(tmp_path, home, marker)
    if not sandboxed:
        monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    out = tmp_path / "out"
    out.mkdir()
    proc = cbuild.run_engine([exe], reads=[exe, lib], writes=[out], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "tokens: 42" in proc.stdout  # the engine and its backend did run
    if sandboxed:
        assert not marker.exists()
        assert "SEED-BYTES" not in proc.stdout
    else:  # the same payload, unsandboxed, gets both: the sandbox is what stops it
        assert "SEED-BYTES" in marker.read_text() and "SEED-BYTES" in proc.stdout


def test_engine_run_outlived_by_nothing(tmp_path):
    """A daemon the engine leaves behind dies with its sandbox (bwrap's pid namespace)."""
    out = tmp_path / "out"
    out.mkdir()
    flag = out / "daemon-alive"
    script = f"(setsid sh -c 'sleep 2; touch {flag}' &) ; echo started"
    proc = cbuild.run_engine(["/bin/sh", "-c", script], reads=[], writes=[out], timeout=30)
    assert proc.returncode == 0 and "started" in proc.stdout
    import time
    time.sleep(3)
    assert not flag.exists()
