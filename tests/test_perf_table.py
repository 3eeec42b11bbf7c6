"""`porter dev perf-table --merge`: the chunk runs of one GPU kind joined into one table and the
[perf.floors] block a target declares from it (no GPU: it reads the chunks' JSON)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from porter.calibration import perf_table
from porter.target import load_target

REPO = Path(__file__).resolve().parent.parent
MEASURED = REPO / "targets" / "ds4" / "perf" / "h200.json"


@pytest.fixture
def chunks(tmp_path) -> list[Path]:
    d = json.loads(MEASURED.read_text())
    out = []
    for i in range(3):
        part = {"rows": d["rows"][i::3], "mutants": d["mutants"] if i == 0 else [], "device": d["device"],
                "seconds": 100.0 + i}
        out.append(tmp_path / f"chunk{i}.json")
        out[-1].write_text(json.dumps(part))
    return out


def test_merged_chunks_give_one_table_and_the_floors_ds4_declares(tmp_path, chunks):
    target = load_target(REPO, "minimoe")  # the rows name ds4's units; the target only styles the table
    out = tmp_path / "table.md"
    # 1: in the recorded table upstream's store_raw_kv_batch (0.018 ms) was refused by its own limit when
    # re-timed in a fresh process on a loaded host (docs/perf.md): the table says so, it is not smoothed over
    assert perf_table.from_json(target, [str(p) for p in chunks], out) == 1
    text = out.read_text()
    per_op, every_case = text.split("## every timed case")
    assert per_op.count("\n| ds4_gpu_") == 57 and "6 of 6 perf mutants refused by the check they name" in text
    assert "on 56 of 57 timed ops" in text
    cases = sum(len(r.get("cases") or []) for r in json.loads(MEASURED.read_text())["rows"])
    assert cases and every_case.count("\n| ds4_gpu_") == cases
    block = text[text.index("[perf.floors]"):text.rindex("```")]
    import tomllib

    declared = tomllib.loads((REPO / "targets" / "ds4" / "target.toml").read_text())["perf"]["floors"]
    assert tomllib.loads(block)["perf"]["floors"] == declared  # target.toml's block is this output, unedited
    merged = json.loads(out.with_suffix(".json").read_text())
    assert len(merged["rows"]) == 57 and merged["device"] == "NVIDIA H200"


def test_chunks_from_different_gpus_or_not_a_table_are_refused(tmp_path, chunks, capsys):
    target = load_target(REPO, "minimoe")
    other = json.loads(chunks[1].read_text())
    other["device"] = "NVIDIA H100 80GB HBM3"
    chunks[1].write_text(json.dumps(other))
    assert perf_table.from_json(target, [str(p) for p in chunks], tmp_path / "t.md") == 2
    assert "different GPUs" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert perf_table.from_json(target, [str(tmp_path / "junk.json")], tmp_path / "t.md") == 2
    assert "not a perf-table JSON" in capsys.readouterr().err


def _timed(case, ms, nbytes, flops=None):
    return {"case": case, "median_ms": ms, "p90_ms": ms * 1.05, "reps": 10, "bytes": nbytes, "flops": flops,
            "gbps": nbytes / (ms * 1e-3) / 1e9, "peak_gbps": 4800.0, "peak_fp32_tflops": 60.0,
            "roofline_ms": max(nbytes / 4.8e12 * 1e3, (flops or 0) / 60e12 * 1e3), "times_ms": [ms] * 10}


def _parity(cases):
    from porter.gates.result import GateResult

    ev = {"gate": "parity", "ok": True, "timing": cases[0], "timed_cases": cases}
    return GateResult("parity", True, "parity ok", evidence=ev)


def test_the_table_shows_every_timed_case_with_its_bound_and_the_verdict_on_it():
    """perf judges every timed case (a prefill-only waste hides in a case that is not the decode one), so
    the table the must-show reads lists each case, not one per op."""
    from porter.gates.result import GateResult

    decode = _timed("decode: 1 token", 0.02, 8_000_000)
    prefill = _timed("prefill: 2048 tokens", 4.0, 8_000_000, flops=2 * 2048 * 4096 * 4096)
    first = _parity([decode, prefill])
    again = _parity([dict(decode, median_ms=0.021), dict(prefill, median_ms=9.0)])
    verdict = GateResult("perf", False, "perf refused", evidence={
        "gate": "perf", "ok": False, "cases": [
            {"case": decode["case"], "ok": True, "ratio": 1.05, "decided_by": "known-good"},
            {"case": prefill["case"], "ok": False, "ratio": 2.25, "decided_by": "known-good"}]})
    rows = perf_table.case_rows(first, again, verdict)
    assert [r["case"] for r in rows] == [decode["case"], prefill["case"]]
    assert [r["bound"] for r in rows] == ["memory", "compute"]
    assert [r["perf"] for r in rows] == ["pass", "fail"] and rows[1]["again_ms"] == 9.0 and rows[1]["ratio"] == 2.25
    target = load_target(REPO, "minimoe")
    text = "\n".join(perf_table.cases_block(target, [{"unit": "ds4_gpu_matmul", "cases": rows}]))
    assert "| ds4_gpu_matmul | prefill: 2048 tokens | 4 |" in text and "| compute |" in text
    assert "2 timed cases over 1 ops; the known-good re-timed in a fresh process passes 1 of the 2 judged" in text
    # a known-good that never passed parity: its cases are listed, judged by nothing
    assert [r["perf"] for r in perf_table.case_rows(first, None, None)] == [None, None]
    assert perf_table.cases_block(target, [{"unit": "old row without cases"}]) == []


def test_a_case_without_declared_bytes_or_flops_is_bound_by_nothing_measured():
    assert perf_table.bound_by({"bytes": None, "flops": None, "peak_gbps": 4800.0}) == "-"
    assert perf_table.bound_by({"bytes": 10**9, "flops": None, "peak_gbps": 4800.0, "peak_fp32_tflops": None}) == "memory"


def test_a_run_cut_short_keeps_every_finished_row_and_merges_as_partial(tmp_path, chunks, capsys):
    """The table is rewritten after each row: a perf-table killed by its time box (a device lease, a
    kill -9) leaves the rows it finished, marked incomplete, and --merge takes them with a warning."""
    target = load_target(REPO, "minimoe")
    rows = [{k: v for k, v in r.items() if k != "measured"} for r in json.loads(chunks[0].read_text())["rows"]]
    out = tmp_path / "part.md"
    kept = perf_table.Kept(target, out, [], time.monotonic())
    kept.row(rows[0], "NVIDIA H200")
    on_disk = json.loads(out.with_suffix(".json").read_text())
    assert on_disk["complete"] is False and [r["unit"] for r in on_disk["rows"]] == [rows[0]["unit"]]
    assert rows[0]["unit"] in out.read_text() and not list(tmp_path.glob("*.part")) and not list(tmp_path.glob(".*.tmp-*"))
    kept.row(rows[1], None)
    assert perf_table.from_json(target, [str(out.with_suffix(".json"))], tmp_path / "merged.md") in (0, 1)
    assert "cut short" in capsys.readouterr().err
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["device"] == "NVIDIA H200"
    # each merged row says which run measured it: the day, the GPU and porter's commit where it is a checkout
    import datetime

    from porter.records import gitops

    note = merged["rows"][0]["measured"]
    assert note.startswith(f"{datetime.date.today().isoformat()}, NVIDIA H200")
    if gitops.toplevel(REPO) == REPO:
        assert f"porter {gitops.head(REPO)[:7]}" in note
    kept.write(done=True)
    assert json.loads(out.with_suffix(".json").read_text())["complete"] is True


def test_missing_from_resumes_a_table_with_only_the_ops_not_measured_on_their_current_spec(tmp_path):
    """`perf-table --missing-from h200.json`: an op counts as measured only with per-case rows taken on
    the spec as it is now; a row from before cases were kept, one from another version of the spec and
    an op with no row are measured again."""
    from types import SimpleNamespace

    specs = {u: SimpleNamespace(sha256=f"sha-{u}") for u in ("a", "b", "c", "d")}
    table = {"rows": [{"unit": "a", "cases": [{"case": "x"}], "spec_sha256": "sha-a"},
                      {"unit": "b", "case": "old single case", "spec_sha256": "sha-b"},
                      {"unit": "c", "cases": [{"case": "x"}], "spec_sha256": "sha-of-an-older-c"}],
             "mutants": [], "device": "NVIDIA H200"}
    assert perf_table.current_rows(table, specs) == {"a"}
    # a perf mutant of the op not judged on a case its current row times: the op is measured again
    table["rows"].append({"unit": "d", "cases": [{"case": "prefill 2048"}], "spec_sha256": "sha-d"})
    table["mutants"] = [{"unit": "a", "mutant": "slow-a", "case": "x", "ok": True},
                        {"unit": "d", "mutant": "slow-d", "case": "prefill 64, a case d no longer times", "ok": True}]
    assert perf_table.current_rows(table, specs, {"a": ["slow-a"], "d": ["slow-d"]}) == {"a"}
    assert perf_table.current_rows(table, specs, {"a": ["slow-a", "never-judged"]}) == {"d"}
    # refused by a parity check before any case was timed: judged on the spec it names
    table["mutants"] += [{"unit": "a", "mutant": "skip-a", "case": None, "spec_sha256": "sha-a", "ok": True},
                         {"unit": "d", "mutant": "skip-d", "case": None, "spec_sha256": "sha-of-an-older-d", "ok": True}]
    assert perf_table.current_rows(table, specs, {"a": ["slow-a", "skip-a"], "d": ["skip-d"]}) == {"a"}
    # refused, but not by the check it names: owed again
    table["mutants"].append({"unit": "a", "mutant": "wrong-check-a", "case": "x", "ok": False})
    assert "a" not in perf_table.current_rows(table, specs, {"a": ["slow-a", "wrong-check-a"]})
    # what a resumed table judges again: none of the mutants already judged on the current spec
    assert perf_table.judged_mutants(table, specs) == {("a", "slow-a"), ("a", "skip-a")}
    # ds4's recorded table: the ops re-measured at their production-size cases are current at HEAD
    from porter.spec import load_specs
    from porter.target import load_target

    from conftest import NO_DS4, ds4_checkout

    if ds4_checkout() is None:
        pytest.skip(NO_DS4)
    ds4 = load_target(REPO, "ds4", ds4_checkout())
    from porter.gates.mutants import perf_rule_mutants

    named: dict[str, list[str]] = {}
    for m in perf_rule_mutants(ds4):
        named.setdefault(m.unit, []).append(m.name)
    from porter.calibration.baseline import times_a_case

    specs = load_specs(ds4)
    current = perf_table.current_rows(json.loads(MEASURED.read_text()), specs, named)
    # every op measured at its production-size cases on its current spec (the 2026-11-29 4x H200 lease
    # re-measured the 51 that owed a row); routed_moe_batch still owes its prefill perf mutant, which no
    # lease has had the time to judge, so its row is measured again with it
    owed_rows = {"ds4_gpu_routed_moe_batch_tensor"}
    assert current == {u for u, s in specs.items() if times_a_case(s)} - owed_rows and len(current) == 56
    owed = {(m.unit, m.name) for m in perf_rule_mutants(ds4)} - perf_table.judged_mutants(
        json.loads(MEASURED.read_text()), specs)
    assert owed == {("ds4_gpu_routed_moe_batch_tensor", "moe-batch-one-token-at-a-time")}


def test_a_measured_note_names_porters_commit_only_from_porters_own_checkout(tmp_path, monkeypatch):
    """porter installed in a virtualenv that lives inside some other repository: that repository's commit is
    not porter's, and the note leaves it out."""
    import subprocess
    from types import SimpleNamespace

    import porter

    repo = tmp_path / "project"
    site = repo / "venv" / "site"
    (site / "porter").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=n", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    monkeypatch.setattr(porter, "__file__", str(site / "porter" / "__init__.py"))
    note = perf_table.provenance(SimpleNamespace(name="t", checkout=None), "NVIDIA H200")
    assert "porter" not in note and note.endswith(", NVIDIA H200")
    monkeypatch.setattr(porter, "__file__", str(repo / "porter" / "__init__.py"))  # porter's own checkout
    assert "porter " in perf_table.provenance(SimpleNamespace(name="t", checkout=None), "NVIDIA H200")


def test_the_cross_process_jitter_is_what_the_recorded_table_measured_and_no_perf_mutant_hides_in_it():
    """perf.CROSS_PROCESS_JITTER_MS is twice the largest amount by which upstream re-timed in a fresh process
    exceeded its first timing over the recorded table (a new table that moves more must move the constant),
    and every perf mutant the table saw refused by `slowdown` is past limit x upstream by far more."""
    from porter.gates import perf

    table = json.loads(MEASURED.read_text())
    moved = [c["again_ms"] - c["ms"] for r in table["rows"] for c in r.get("cases") or []
             if c.get("again_ms") and c.get("ms")]
    assert len(moved) > 50 and 2 * max(moved) <= perf.CROSS_PROCESS_JITTER_MS < 2 * max(moved) + 0.001
    cases = {(r["unit"], c["case"]): c for r in table["rows"] for c in r.get("cases") or []}
    slow = [m for m in table["mutants"] if m["got"] == "slowdown"]
    assert len(slow) >= 5
    for m in slow:
        c = cases[(m["unit"], m["case"])]
        assert m["ms"] - c["limit"] * c["ms"] > 10 * perf.CROSS_PROCESS_JITTER_MS, m["mutant"]
