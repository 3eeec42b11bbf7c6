"""`porter calibrate --mutate` end to end: on a machine without a GPU it generates, deduplicates and builds,
then says in one line that parity needs a GPU (exit 2) or, with --builds-only, stops there (exit 0); with a
GPU it judges every mutant.  calibrate's own table shows a recorded score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from porter.gates.parity import available
from conftest import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_swiglu_tensor"
NO_GPU = {"PORTER_PARITY": "off"}  # the machine without a GPU, wherever the test runs
SMALL = ["calibrate", "--target", "minimoe", "--mutate", "--unit", UNIT, "--op", "drop_store", "--op", "drop_guard",
         "--budget", "1"]


@needs_nvcc
def test_without_a_gpu_it_builds_then_says_parity_needs_one_in_one_line_and_exits_2(porter_cli, build_cache):
    r = porter_cli(REPO, *SMALL, env=NO_GPU)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("parity needs a GPU: parity disabled by PORTER_PARITY=off; 2 mutants built, none judged")
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.strip()}
    assert rows["drop_store"][2:] == ["1", "0", "0", "0", "1"] and rows["drop_guard"][2] == "1"
    assert "to run" in r.stdout and "score" not in r.stdout


@needs_nvcc
def test_builds_only_exits_0_and_json_says_nothing_was_judged(porter_cli, build_cache):
    r = porter_cli(REPO, *SMALL, "--builds-only", "--json", env=NO_GPU)
    assert r.returncode == 0, r.stderr
    assert "parity needs a GPU" not in r.stderr
    rep = json.loads(r.stdout)
    assert rep["judged"] is False and rep["not_judged_because"] == "--builds-only"
    assert [(m["op"], m["outcome"]) for m in rep["mutants"]] == [("drop_store", "not-run"), ("drop_guard", "not-run")]
    assert rep["summary"]["overall"]["score"] is None
    assert rep["units"][UNIT]["candidates"] == {"drop_store": 1, "drop_guard": 4}
    # the same seed draws the same mutants on the next run; another seed may draw another guard
    again = json.loads(porter_cli(REPO, *SMALL, "--builds-only", "--json", env=NO_GPU).stdout)
    assert [m["id"] for m in again["mutants"]] == [m["id"] for m in rep["mutants"]]


@pytest.mark.parametrize("args, message", [
    (["--mutate", "--write"], "--write records a judged table: parity cannot run here (parity disabled"),
    (["--mutate", "--write", "--builds-only"], "--write records a judged table: --builds-only judges nothing"),
    (["--budget", "3", "--no-ledger"], "--budget: only with --mutate"),
    (["--mutate", "--budget", "0"], "--budget must be at least 1, not 0"),
    (["--mutate", "--op", "nope"], "no mutation operator nope (known: arith,"),
    (["--mutate", "--known-good", "lib.so"], "--known-good lib.so: mutation testing mutates sources"),
    (["--mutate", "--unit", "mini_gpu_nothing"], "no parity spec for mini_gpu_nothing"),
])
def test_what_cannot_run_is_one_line_and_exit_2(porter_cli, build_cache, args, message):
    r = porter_cli(REPO, "calibrate", "--target", "minimoe", *args, env=NO_GPU)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_a_malformed_declaration_file_stops_it_before_any_work(porter_cli, workspace):
    (workspace / "targets" / "minimoe" / "equivalent_mutants.toml").write_text("[[equivalent]]\nunit = 'x'\n")
    r = porter_cli(workspace, "calibrate", "--mutate", "--unit", UNIT, env=NO_GPU)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"porter: error: {workspace / 'targets' / 'minimoe' / 'equivalent_mutants.toml'}: equivalent #1 lacks op, id, "
        "reason (each needs unit, op, id, reason)"]


def test_calibrates_table_shows_the_recorded_score_with_todays_declarations(workspace):
    from porter.calibration.mutate import command, report
    from porter.target import load_target

    target = load_target(workspace, "minimoe")
    (target.dir / "mutation.json").unlink(missing_ok=True)  # the workspace's copy of the recorded table
    assert command.recorded_table(target, {"rows": [{"unit": UNIT}]}) == ""  # no table: nothing shown
    from porter.spec import load_specs

    sha = load_specs(target)[UNIT].sha256
    mutants = [{"id": "a" * 12, "unit": UNIT, "op": "arith", "outcome": "killed", "check": "nmse"},
               {"id": "b" * 12, "unit": UNIT, "op": "arith", "outcome": "survived"}]
    report.write_record(target, {"target": "minimoe", "seed": 0, "budget": 8, "units": {UNIT: {"spec_sha256": sha}},
                                 "mutants": mutants})
    text = command.recorded_table(target, {"rows": [{"unit": UNIT}, {"unit": "mini_gpu_add_tensor"}]})
    assert "50.0% overall (1 killed, 1 survived)" in text and "targets/minimoe/mutation.json" in text
    assert {ln.split()[0]: ln.split()[-1] for ln in text.splitlines()[1:] if ln.strip()} == \
        {"unit": "score", "swiglu": "50.0%", "add": "measured"}
    (target.dir / "equivalent_mutants.toml").write_text(
        f"[[equivalent]]\nunit = '{UNIT}'\nop = 'arith'\nid = '{'b' * 12}'\nreason = 'reviewed'\n")
    assert "100.0% overall (1 killed, 0 survived)" in command.recorded_table(target, {"rows": [{"unit": UNIT}]})
    (target.dir / "equivalent_mutants.toml").write_text("bad = [")
    assert command.recorded_table(target, {"rows": []}).startswith("mutation table: ")  # calibrate still reports


_gpu, _why = available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu, reason=f"parity gate unavailable here: {_why}")
def test_on_a_gpu_every_mutant_is_judged_and_a_dropped_store_is_killed(porter_cli, build_cache):
    r = porter_cli(REPO, "calibrate", "--target", "minimoe", "--mutate", "--unit", UNIT, "--op", "drop_store",
                   "--op", "early_return", "--budget", "2", "--json")
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    assert rep["judged"] and rep["units"][UNIT]["known_good"]["ok"]
    store = [m for m in rep["mutants"] if m["op"] == "drop_store"]
    assert store and all(m["outcome"] == "killed" for m in store), store
    assert not [m for m in rep["mutants"] if m["outcome"] == "not-run"]
    assert r.returncode == (1 if rep["summary"]["overall"]["survived"] else 0)


@needs_nvcc
def test_the_judged_path_writes_the_table_shows_survivors_and_a_declared_one_clears_the_exit(
        workspace, build_cache, monkeypatch, capsys):
    """The GPU path on stand-in parity runs (the real ones are the GPU test's): the table, the survivor's diff,
    --write, exit 1 while a survivor is left and 0 once it is declared equivalent."""
    import porter.calibration.mutate.runner as runner
    import porter.gates.parity as parity
    from porter.cli import main

    monkeypatch.setattr(parity, "available", lambda: (True, "stand-in"))

    def stand_in(target, libs, built, units, opts, out=print):
        distinct = [b for b in built if b.status == "distinct"]
        facts = {u: {"ok": True, "word": "pass", "summary": "ok", "seconds": 1.0, "device": "Stand-in GPU"}
                 for u in units}
        return facts, {b.mutation.id: {"id": b.mutation.id, "outcome": "survived" if i == 0 else "killed",
                                       "check": None if i == 0 else "sentinel", "summary": "stand-in"}
                       for i, b in enumerate(distinct)}

    monkeypatch.setattr(runner, "run_all", stand_in)
    args = ["-C", str(workspace), "calibrate", "--mutate", "--unit", UNIT, "--op", "drop_guard", "--budget", "2"]
    assert main([*args, "--write"]) == 1
    out = capsys.readouterr().out
    rec = json.loads((workspace / "targets" / "minimoe" / "mutation.json").read_text())
    survivor = next(m for m in rec["mutants"] if m["outcome"] == "survived")
    assert rec["devices"] == ["Stand-in GPU"] and rec["measured"]["overall"]["score"] == 0.5
    assert f"survived {UNIT} drop_guard {survivor['id']}" in out and survivor["diff"].splitlines()[0] in out
    assert "score 50.0%" in out.splitlines()[-1]
    (workspace / "targets" / "minimoe" / "equivalent_mutants.toml").write_text(
        f"[[equivalent]]\nunit = '{UNIT}'\nop = 'drop_guard'\nid = '{survivor['id']}'\nreason = 'stand-in review'\n")
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "1 equivalent" in last and "0 survived, score 100.0%" in last
