"""Facts a workspace carries, and what a newcomer is told about them.

- the source checkout given to `porter init --source` is remembered, so the `next:` line init prints works;
- init says where the signing key is and what a second machine or user must do, and a run under
  another PORTER_HOME gets that remedy in its one-line error;
- `porter --version`; `porter units` shows each unit's derived state;
- the ds4 tests' skip reason says how to get ds4; a test's table is not printed under -q.
"""

from __future__ import annotations

import json
import re
import shutil
import types
from pathlib import Path

from conftest import NO_DS4, show_if_verbose
from ws_builder import make_workspace

TESTS = Path(__file__).resolve().parent
TINY = TESTS / "data" / "tinytarget"


def tiny_without_its_own_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """tinytarget as a user's target: the folder (no default_checkout) and the engine checkout apart."""
    folder, checkout = tmp_path / "tinytarget", tmp_path / "src" / "tiny-engine"
    shutil.copytree(TINY, folder)
    shutil.copytree(TINY, checkout)
    toml = folder / "target.toml"
    text = toml.read_text()
    assert "default_checkout" in text
    toml.write_text(re.sub(r"(?m)^default_checkout.*\n", "", text))
    return folder, checkout


def test_the_source_given_at_init_is_remembered_and_the_next_line_works(tmp_path, porter_cli):
    folder, checkout = tiny_without_its_own_checkout(tmp_path)
    ws = tmp_path / "ws"
    init = porter_cli(None, "init", str(ws), "--target", str(folder), "--source", str(checkout))
    assert init.returncode == 0, init.stderr
    assert f"source: {checkout.resolve()}" in init.stdout
    nxt = next(line for line in init.stdout.splitlines() if line.startswith("next: "))
    assert "porter units" in nxt
    units = porter_cli(ws, "units")  # what the next line runs first, with no --source
    assert units.returncode == 0, units.stderr
    assert "tiny_gpu_scale_tensor" in units.stdout
    # committed with the workspace; --source and the environment still win over it
    import subprocess

    tracked = subprocess.run(["git", "-C", str(ws), "ls-files", "porter.toml"], capture_output=True, text=True)
    assert tracked.stdout.strip() == "porter.toml"
    moved = tmp_path / "elsewhere"
    shutil.move(str(checkout), moved)
    gone = porter_cli(ws, "units")
    assert gone.returncode == 2 and "porter.toml" in gone.stderr and "--source" in gone.stderr
    assert porter_cli(ws, "units", "--source", str(moved)).returncode == 0
    assert porter_cli(ws, "units", env={"PORTER_TINYTARGET_SOURCE": str(moved)}).returncode == 0


def test_init_says_where_the_key_is_and_what_another_machine_needs(tmp_path, porter_cli):
    r = porter_cli(None, "init", str(tmp_path / "ws"))
    assert r.returncode == 0, r.stderr
    home = Path(__import__("os").environ["PORTER_HOME"])
    line = next(x for x in r.stdout.splitlines() if x.startswith("signing key: "))
    assert str(home / "signing_key") in line and "made now" in line and "ledger/signer.pub" in line
    assert "another machine" in r.stdout and "PORTER_SIGNING_KEY" in r.stdout
    again = porter_cli(None, "init", str(tmp_path / "ws2"))
    assert "yours already" in again.stdout


def test_another_porter_home_gets_the_remedy_in_one_line(tmp_path, porter_cli):
    ws = tmp_path / "ws"
    assert porter_cli(None, "init", str(ws)).returncode == 0
    r = porter_cli(ws, "run", "--provider", "scripted", "--max-units", "1",
                   env={"PORTER_HOME": str(tmp_path / "other-home")})
    assert r.returncode == 3
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("porter: error: "), r.stderr
    assert "PORTER_SIGNING_KEY" in err[0] and "Copy the key that signed it" in err[0]


def test_version(porter_cli):
    r = porter_cli(None, "--version")
    assert r.returncode == 0 and re.match(r"porter \d+\.\d+\.\d+", r.stdout), r.stdout + r.stderr


def test_units_shows_each_units_state_not_its_file(tmp_path, porter_cli):
    ws = make_workspace(tmp_path / "ws")
    ws.port("mini_gpu_add_tensor", 1, state="built")
    ws.fail("mini_gpu_swiglu_tensor", 1, gate="static", summary="stub body")
    data = {u["unit"]: u for u in json.loads(porter_cli(ws.root, "units", "--json").stdout)["units"]}
    assert data["mini_gpu_add_tensor"]["state"] == "built" and data["mini_gpu_add_tensor"]["file_state"] == "written"
    assert data["mini_gpu_swiglu_tensor"]["state"] == "failing"
    assert data["mini_gpu_init"]["state"] == "unported" and data["mini_gpu_init"]["file_state"] == "placeholder"
    text = porter_cli(ws.root, "units").stdout
    row = next(x for x in text.splitlines() if "mini_gpu_add_tensor(" in x)
    assert "built (not judged)" in row and not re.search(r"\bported\b(?!/)", text)
    assert re.search(r"1 built \(not judged\), 1 failing, 22 unported", text), text.splitlines()[0]


def test_the_ds4_skip_reason_says_how_to_get_ds4():
    assert "git clone https://github.com/antirez/ds4" in NO_DS4 and "PORTER_DS4_SOURCE" in NO_DS4
    # every ds4 test skips with that one reason, not its own shorter version
    own = [p.name for p in TESTS.glob("test_*.py") if re.search(r"[\"']no ds4 checkout", p.read_text())]
    assert not own, own


def test_a_tests_table_is_shown_under_v_and_not_under_q():
    written = []
    plugins = {"terminalreporter": types.SimpleNamespace(write_line=written.append), "capturemanager": None}
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(getplugin=plugins.get),
                                   get_verbosity=lambda: 0)
    assert not show_if_verbose(config, ["a table"]) and written == []
    config.get_verbosity = lambda: 1
    assert show_if_verbose(config, ["a table"]) and written == ["a table"]
