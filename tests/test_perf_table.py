"""`porter dev perf-table --merge`: the chunk runs of one GPU kind joined into one table and the
[perf.floors] block a target declares from it (no GPU: it reads the chunks' JSON)."""

from __future__ import annotations

import json
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
    assert perf_table.from_json(target, [str(p) for p in chunks], out) == 0
    text = out.read_text()
    assert text.count("\n| ds4_gpu_") == 57 and "4 of 4 perf mutants refused" in text
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
