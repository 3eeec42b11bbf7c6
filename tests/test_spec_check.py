"""A target's parity specs checked on the CPU (issue 43, item 4): porter.gates.parity.spec_check, run by
`porter doctor`, `porter plan` and `porter run`'s preflight.  Each broken spec kind is shown caught, with
the file, the case and the problem in one line, and `porter run` stopping before any answer is asked for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from porter.errors import PorterError
from porter.gates.parity import spec_check
from porter.target import load_target
from porter.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "tests" / "data" / "tinytarget"
ADD = "targets/tinytarget/parity/tiny_gpu_add_tensor.py"


@pytest.fixture
def ws(tmp_path) -> Path:
    return init_workspace(tmp_path / "ws", [str(TINY)])


def edit(ws: Path, old: str, new: str, rel: str = ADD) -> None:
    path = ws / rel
    text = path.read_text()
    assert old in text, (old, rel)
    path.write_text(text.replace(old, new))


def problems(ws: Path) -> list[str]:
    return [p.line() for p in spec_check.check(load_target(ws, "tinytarget"), cache=False).problems]


def test_the_bundled_and_tiny_targets_specs_all_build(ws):
    assert problems(ws) == []
    rep = spec_check.check(load_target(REPO, "minimoe"), cache=False)
    assert rep.ok and rep.specs == 24 and rep.cases > 100 and rep.without_spec == [], [p.line() for p in rep.problems]


def test_a_build_that_crashes_in_numpy_names_file_case_and_error(ws):
    edit(ws, "b = rng.standard_normal(n)", "b = rng.standard_normal(n).reshape(n, -1) @ np.ones((2, 2))")
    [line] = problems(ws)
    assert line.startswith(f"{ADD}, case 'n=7': building inputs failed: ValueError"), line


def test_an_argument_the_header_does_not_have(ws):
    edit(ws, '"b": In(b), "n": n}, expect', '"b": In(b), "count": n}, expect')
    [line] = problems(ws)
    assert "case 'n=7'" in line and "arguments not in the header: count" in line, line


def test_a_reference_of_the_wrong_size(ws):
    edit(ws, 'expect={"out": ref.add(a, b)})\n\n\nSPEC', 'expect={"out": ref.add(a, b)[:-1]})\n\n\nSPEC')
    line = problems(ws)[0]  # then the same for the other case it reaches
    assert "case 'n=7'" in line and "the reference holds 6 values" in line and "writes 7" in line, line


def test_an_exact_output_with_a_float_reference(ws):
    edit(ws, 'outputs={"out": Tol(nmse=None, max_err_rms=None, max_abs=0.0)}',
         'outputs={"out": Exact()}')
    edit(ws, "import Call, In", "import Call, Exact, In")
    line = problems(ws)[0]
    assert "compared exactly" in line, line


def test_a_scalar_drawn_per_seed_changes_the_layout(ws):
    """tests/data/tinytarget's own scale spec drew its scalar from the seed: on a GPU its unit was
    "parity skipped: spec error" and nothing said so before; the check found it."""
    edit(ws, "s = float(np.random.default_rng(n).uniform(-2.0, 2.0))", "s = float(rng.uniform(-2.0, 2.0))",
         "targets/tinytarget/parity/tiny_gpu_scale_tensor.py")
    [line] = problems(ws)
    assert "tiny_gpu_scale_tensor.py, case 'n=1': the two seeds give different layouts" in line


def test_a_spec_that_does_not_import_and_one_for_no_unit(ws):
    (ws / "targets/tinytarget/parity/tiny_gpu_nothing.py").write_text("import numpy as np\nx = 1 / 0\n")
    (ws / "targets/tinytarget/parity/tiny_gpu_empty.py").write_text("X = 1\n")
    lines = problems(ws)
    assert any(ln.startswith("targets/tinytarget/parity/tiny_gpu_nothing.py: does not import: ZeroDivisionError")
               for ln in lines), lines
    assert any(ln.startswith("targets/tinytarget/parity/tiny_gpu_empty.py: defines no SPEC") for ln in lines), lines


def test_a_scenario_whose_script_calls_what_the_header_lacks(tmp_path):
    ws = init_workspace(tmp_path / "ws", ["minimoe"])
    edit(ws, "    rt.play_init(s)\n", '    rt.play_init(s)\n    s.call("mini_gpu_tensor_byts", expect="ok")\n',
         "targets/minimoe/parity/mini_gpu_tensor_bytes.py")
    lines = [p.line() for p in spec_check.check(load_target(ws, "minimoe"), cache=False).problems]
    assert lines == ["targets/minimoe/parity/mini_gpu_tensor_bytes.py, case 'sizes 1, 3, 4099, 65537': step "
                     + lines[0].split(": step ", 1)[-1]] and "mini_gpu_tensor_byts" in lines[0], lines


def test_a_passed_spec_is_remembered_until_it_changes(ws):
    target = load_target(ws, "tinytarget")
    first = spec_check.check(target)
    assert first.ok and first.cached == 0 and first.cases == 6
    again = spec_check.check(target)
    assert again.ok and again.cached == 2 and again.cases == 0
    edit(ws, '"b": In(b), "n": n}, expect', '"b": In(b), "count": n}, expect')
    changed = spec_check.check(load_target(ws, "tinytarget"))
    assert not changed.ok and changed.cached == 1


def test_plan_stops_on_a_broken_spec_in_one_line(ws, porter_cli):
    edit(ws, "b = rng.standard_normal(n)", "b = rng.standard_normal(n) @ np.ones((3, 3))")
    r = porter_cli(ws, "plan")
    assert r.returncode == 2 and r.stdout == ""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("porter: error:")]
    assert errors == [ln for ln in r.stderr.splitlines() if "error" in ln] and len(errors) == 1
    assert f"broken parity spec {ADD}, case 'n=7': building inputs failed: ValueError" in errors[0]


def test_doctor_lists_every_broken_spec_and_fails(ws, porter_cli):
    edit(ws, "b = rng.standard_normal(n)", "b = rng.standard_normal(n) @ np.ones((3, 3))")
    edit(ws, "s = float(np.random.default_rng(n).uniform(-2.0, 2.0))", "s = float(rng.uniform(-2.0, 2.0))",
         "targets/tinytarget/parity/tiny_gpu_scale_tensor.py")
    r = porter_cli(ws, "doctor", "--json")
    assert r.returncode == 2
    bad = [c for c in json.loads(r.stdout)["checks"] if c["name"] == "parity spec"]
    assert len(bad) == 2 and all(not c["ok"] and c["required"] for c in bad)
    assert {c["detail"].split(",")[0] for c in bad} == {ADD, "targets/tinytarget/parity/tiny_gpu_scale_tensor.py"}


def test_doctor_says_which_units_have_no_spec(ws, porter_cli):
    (ws / ADD).unlink()
    r = porter_cli(ws, "doctor", "--json")
    c = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "parity specs" and not c["ok"])
    assert not c["required"] and "tiny_gpu_add_tensor" in c["detail"] and "never 'verified'" in c["detail"]


def test_run_stops_on_a_broken_spec_before_any_answer(ws, porter_cli, monkeypatch):
    from porter.commands import doctor

    edit(ws, '"b": In(b), "n": n}, expect', '"b": In(b), "count": n}, expect')
    target = load_target(ws, "tinytarget")
    monkeypatch.setattr(doctor, "checks", lambda *a, **k: [])  # the machine's checks are not what is tested here
    with pytest.raises(PorterError) as e:
        doctor.preflight(ws, target, "run")
    assert "broken parity spec" in str(e.value) and "count" in str(e.value) and "\n" not in str(e.value)
    if shutil.which("nvcc") is not None:  # the whole command: exit 2, no attempt recorded
        r = porter_cli(ws, "run", "--provider", "scripted", "--max-attempts", "1")
        assert r.returncode == 2 and "broken parity spec" in r.stderr, r.stdout + r.stderr
        assert "attempt" not in r.stdout
        ledger = list((ws / "ledger").rglob("*.jsonl"))
        assert not any("attempt" in p.read_text() for p in ledger)


def test_a_misspelled_kernel_name_is_flagged_by_plan_and_doctor_by_default(ws, porter_cli):
    src = ws / "targets/tinytarget/tiny_metal.m"
    src.write_text(src.read_text().replace('"kernel_add_f32"', '"kernel_add_f23"'))
    plan = porter_cli(ws, "plan")
    assert plan.returncode == 0
    assert "warning: names the Metal host dispatches that no .metal source defines: tiny_gpu_add_tensor: " \
           "kernel_add_f23" in plan.stderr
    doc = porter_cli(ws, "doctor", "--json")
    c = next(c for c in json.loads(doc.stdout)["checks"] if c["name"] == "kernels")
    assert not c["ok"] and "kernel_add_f23" in c["detail"]


def test_a_cpu_backend_that_is_not_there_fails_the_doctor(ws, porter_cli):
    toml = ws / "targets/tinytarget/target.toml"
    toml.write_text(toml.read_text().replace('cpu_backend = "tiny_cpu.c"', 'cpu_backend = "tiny_cpu_gone.c"'))
    r = porter_cli(ws, "doctor", "--json")
    c = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "cpu backend")
    assert r.returncode == 2 and not c["ok"] and "tiny_cpu_gone.c" in c["detail"]
    toml.write_text(toml.read_text().replace("tiny_cpu_gone.c", "tiny_cpu.c"))
    r = porter_cli(ws, "doctor", "--json")
    c = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "cpu backend")
    assert c["ok"] or c["note"], c
