"""Target code and declarations porter reads instead of naming a target: the e2e driver loaded by path,
the upstream build recipe from [upstream], the bundled example target found by listing targets/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from porter.calibration.libraries import recipe_for
from porter.errors import PorterError
from porter.gates.e2e.gate import run_e2e
from porter.gates.e2e.target_driver import load_driver
from porter.target import load_target
from porter.workspace import example_target, init_workspace, target_folder

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tinytarget"


def _tiny_with_e2e(tmp_path: Path, driver_text: str):
    """tinytarget with an [e2e] whose driver is `driver_text`, and a calibration file in place."""
    ws = init_workspace(tmp_path / "ws", [str(TINY)])
    d = ws / "targets" / "tinytarget"
    (d / "target.toml").write_text((d / "target.toml").read_text() + '\n[e2e]\ndriver = "e2e/driver.py"\n')
    (d / "e2e").mkdir()
    (d / "e2e" / "driver.py").write_text(driver_text)
    (d / "e2e" / "calibration.json").write_text("{}")
    return load_target(ws, "tinytarget")


def test_a_driver_without_prefill_pair_is_refused_and_the_gate_skips(tmp_path, monkeypatch):
    target = _tiny_with_e2e(tmp_path, "def calibrate(target, scratch, **kw):\n    raise NotImplementedError\n")
    with pytest.raises(PorterError, match="defines no prefill_pair"):
        load_driver(target)
    from porter.gates.e2e import calibration as cal_mod

    monkeypatch.setattr(cal_mod, "load_rule", lambda path: (None, {}, "sha"))
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x")
    res = run_e2e(target, target.workspace, lib)
    assert res.skipped and not res.ok and "defines no prefill_pair" in res.summary, res.summary


def test_a_driver_that_does_not_import_is_one_clear_error(tmp_path):
    target = _tiny_with_e2e(tmp_path, "import no_such_module_here\n")
    with pytest.raises(PorterError, match="does not import: ModuleNotFoundError"):
        load_driver(target)


def test_the_bundled_drivers_provide_the_interface():
    from porter.gates.e2e.target_driver import REQUIRED
    from porter.target.code import load_file

    minimoe = load_driver(load_target(ROOT, "minimoe"))
    ds4 = load_file(ROOT / "targets" / "ds4" / "e2e" / "driver.py")  # ds4 needs a checkout to load as a target
    for mod in (minimoe, ds4):
        assert all(callable(getattr(mod, n)) for n in REQUIRED), mod.__name__
    assert minimoe is not ds4  # two targets' e2e/driver.py are two modules


def test_the_upstream_recipe_is_the_targets_declaration(tmp_path):
    ws = init_workspace(tmp_path / "ws", [str(TINY)])
    tiny = load_target(ws, "tinytarget")
    with pytest.raises(PorterError, match="declares no \\[upstream\\]"):
        recipe_for(tiny)
    toml = tiny.dir / "target.toml"
    toml.write_text(toml.read_text() + '\n[upstream]\nsources = ["tiny_cpu.c"]\nlibrary = "libtiny_up.so"\n')
    r = recipe_for(load_target(ws, "tinytarget"))
    assert r.sources == ["tiny_cpu.c"] and r.library == "libtiny_up.so" and r.needs == [] and r.link_flags == []


def test_the_example_target_is_the_one_bundled_with_its_own_checkout():
    assert example_target() == "minimoe"


def test_init_takes_a_target_folder_named_by_its_toml(tmp_path):
    name, folder = target_folder(str(TINY))
    assert (name, folder) == ("tinytarget", TINY.resolve())
    bad = tmp_path / "bad"
    shutil.copytree(TINY, bad)
    (bad / "target.toml").write_text('description = "no name"\n')
    with pytest.raises(PorterError, match="declares no usable name"):
        target_folder(str(bad))
    with pytest.raises(PorterError, match="no bundled target 'nosuch'"):
        target_folder("nosuch")
