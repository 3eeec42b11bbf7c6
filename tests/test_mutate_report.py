"""The mutation table (porter/calibration/mutate/report.py) and a target's declared equivalents
(declared.py): the arithmetic of the score, declarations applied when shown, the recorded file."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from porter.calibration.mutate import declared, report
from porter.errors import PorterError


def mut(id_, unit="u", op="arith", outcome="killed", check=None, **more):
    return {"id": id_, "unit": unit, "op": op, "location": "3:4", "function": "k", "where": "kernel",
            "note": "`+` -> `-`", "outcome": outcome, **({"check": check} if check else {}), **more}


MUTANTS = [
    mut("a" * 12, check="nmse"), mut("b" * 12, check="nmse"), mut("c" * 12, check="sentinel"),
    mut("d" * 12, outcome="survived", diff="--- x\n+++ y\n"), mut("e" * 12, outcome="did-not-build"),
    mut("f" * 12, outcome="equivalent"), mut("0" * 12, outcome="duplicate", same_as="a" * 12),
    mut("1" * 12, op="constant", outcome="survived"), mut("2" * 12, op="constant", check="timeout"),
    mut("3" * 12, unit="v", op="constant", outcome="not-run"),
]


def test_counts_and_score_per_operator_unit_and_overall():
    s = report.summarize(MUTANTS)
    arith = s["ops"]["arith"]
    assert (arith["generated"], arith["killed"], arith["survived"], arith["did-not-build"], arith["equivalent"],
            arith["duplicate"]) == (7, 3, 1, 1, 1, 1)
    assert arith["score"] == 0.75 and arith["killed_by"] == {"nmse": 2, "sentinel": 1}
    assert s["ops"]["constant"]["score"] == 0.5
    o = s["overall"]
    assert (o["generated"], o["killed"], o["survived"], o["not-run"]) == (10, 4, 2, 1)
    assert o["score"] == round(4 / 6, 4)
    assert s["units"]["v"]["score"] is None  # nothing judged: no score, never 0% or 100%
    assert report.score_text(s["units"]["v"]) == "-" and report.score_text(arith) == "75.0%"
    assert s["unit_ops"]["u"]["constant"]["generated"] == 2


def test_a_declared_survivor_is_equivalent_with_its_reason_and_a_mismatched_one_is_not():
    decl = declared.parse('''
[[equivalent]]
unit = "u"
op = "arith"
id = "dddddddddddd"
reason = "the sum is never above 2^24"

[[equivalent]]
unit = "u"
op = "arith"
id = "111111111111"
reason = "declared with the wrong operator: must not match"

[[equivalent]]
unit = "u"
op = "compare"
id = "999999999999"
reason = "no such mutant any more"
''')
    shown, unmatched = report.declared_outcomes(MUTANTS, decl)
    d = next(m for m in shown if m["id"] == "d" * 12)
    assert d["outcome"] == "equivalent" and d["declared"] and d["reason"] == "the sum is never above 2^24"
    assert next(m for m in shown if m["id"] == "1" * 12)["outcome"] == "survived"
    assert sorted(x.id for x in unmatched) == ["111111111111", "999999999999"]
    s = report.summarize(shown)
    assert s["ops"]["arith"]["score"] == 1.0 and s["ops"]["arith"]["equivalent"] == 2
    assert MUTANTS[3]["outcome"] == "survived", "the measured outcomes are left as measured"


def test_a_declaration_for_a_killed_mutant_changes_nothing():
    decl = {"a" * 12: declared.Declared("u", "arith", "a" * 12, "wrongly declared")}
    shown, unmatched = report.declared_outcomes(MUTANTS, decl)
    assert shown[0]["outcome"] == "killed" and not unmatched


@pytest.mark.parametrize("text, message", [
    ("[[equivalent]]\nunit = 'u'\nop = 'arith'\nid = 'aaaaaaaaaaaa'\n", r"equivalent #1 lacks reason \(each needs"),
    ("[[equivalent]]\nunit = 'u'\nop = 'arith'\nid = 'aaaaaaaaaaaa'\nreason = ''\n", r"reason must be non-empty"),
    ("[[equivalent]]\nunit = 'u'\nop = 'swap'\nid = 'aaaaaaaaaaaa'\nreason = 'r'\n", r"no operator 'swap' \(known: "),
    ("[[equivalent]]\nunit = 'u'\nop = 'arith'\nid = 'AAAA'\nreason = 'r'\n", r"id 'AAAA' is not a mutant id"),
    ("[[equivalent]]\nunit = 'u'\nop = 'arith'\nid = 'aaaaaaaaaaaa'\nreason = 'r'\nwhy = 'x'\n",
     r"unknown key\(s\) why"),
    ("[[equivalent]]\nunit = 'u'\nop = 'arith'\nid = 'aaaaaaaaaaaa'\nreason = 'r'\n" * 2, r"equivalent #2: mutant "
     r"aaaaaaaaaaaa is declared twice"),
    ("[[survivor]]\nid = 1\n", r"unknown table\(s\) survivor"),
    ("equivalent = 3\n", r"must be an array of tables"),
    ("[[equivalent]\n", r"not valid TOML"),
])
def test_a_malformed_declaration_file_is_one_line_naming_the_file_and_entry(text, message, tmp_path):
    (tmp_path / declared.FILE).write_text(text)
    with pytest.raises(PorterError, match=message) as exc:
        declared.load(tmp_path)
    assert str(exc.value).startswith(str(tmp_path / declared.FILE)) and "\n" not in str(exc.value)


def test_no_declaration_file_is_no_declaration(tmp_path):
    assert declared.load(tmp_path) == {}


def test_the_record_keeps_what_was_measured_and_shows_todays_declarations_and_stale_specs(tmp_path):
    target = SimpleNamespace(dir=tmp_path, name="t")
    run = {"target": "t", "known_good": "k", "seed": 0, "budget": 8, "ops": ["arith"], "seconds": 1.0,
           "units": {"u": {"spec_sha256": "s1"}, "v": {"spec_sha256": "s2"}}, "mutants": MUTANTS, "summary": {}}
    path, what = report.write_record(target, run)
    assert path == tmp_path / "mutation.json" and what == "new table"
    data = json.loads(path.read_text())
    assert data["format"] == report.FORMAT and "summary" not in data and len(data["mutants"]) == len(MUTANTS)
    before = report.recorded_scores(target, {"u": "s1", "v": "s2"}, {})
    assert before["units"]["u"] == "66.7%" and before["stale"] == []
    decl = {"d" * 12: declared.Declared("u", "arith", "d" * 12, "reviewed")}
    after = report.recorded_scores(target, {"u": "s1-edited", "v": "s2"}, decl)
    assert after["units"]["u"] == "80.0% (stale)" and after["stale"] == ["u"]
    text = report.recorded_text(after, ["u", "w"], "", "targets/t/mutation.json")
    assert "80.0% (stale)" in text and "not measured" in text and "targets/t/mutation.json" in text


def test_chunks_of_one_draw_merge_into_one_table_and_another_draw_replaces_it(tmp_path):
    target = SimpleNamespace(dir=tmp_path, name="t")
    draw = {"target": "t", "known_good": "k", "seed": 0, "budget": 8, "ops": ["arith", "constant"]}
    first = [m for m in MUTANTS if m["unit"] == "u"]
    first = [dict(m, diff="d") for m in first]
    report.write_record(target, {**draw, "units": {"u": {}}, "mutants": first, "devices": ["A"], "seconds": 2.0})
    kept = report.read_record(target)["mutants"]
    assert [m["id"] for m in kept if "diff" in m] == ["d" * 12, "1" * 12], "only the survivors keep their diff"
    second = [m for m in MUTANTS if m["unit"] == "v"]
    _p, what = report.write_record(target, {**draw, "units": {"v": {}}, "mutants": second, "devices": ["B"],
                                            "seconds": 3.0})
    rec = report.read_record(target)
    assert what == "merged with the 1 other unit(s) of the same draw"
    assert sorted(rec["units"]) == ["u", "v"] and len(rec["mutants"]) == len(MUTANTS)
    assert rec["devices"] == ["A", "B"] and rec["seconds"] == 5.0
    assert rec["measured"]["overall"] == report.summarize(MUTANTS)["overall"]  # the merged table's, as measured
    # the same unit again replaces its own rows, not adds to them
    report.write_record(target, {**draw, "units": {"v": {}}, "mutants": second})
    assert len(report.read_record(target)["mutants"]) == len(MUTANTS)
    _p, what = report.write_record(target, {**draw, "seed": 1, "units": {"v": {}}, "mutants": second})
    assert what.startswith("replaced") and sorted(report.read_record(target)["units"]) == ["v"]


def test_a_record_that_does_not_read_is_one_line(tmp_path):
    target = SimpleNamespace(dir=tmp_path, name="t")
    assert report.read_record(target) is None
    (tmp_path / "mutation.json").write_text("{not json")
    with pytest.raises(PorterError, match="not a mutation table"):
        report.read_record(target)
    (tmp_path / "mutation.json").write_text(json.dumps({"format": 99, "mutants": []}))
    with pytest.raises(PorterError, match="of format 1"):
        report.read_record(target)


def test_the_operator_table_lists_every_operator_asked_for_even_with_nothing_drawn():
    s = report.summarize(MUTANTS)
    text = report.op_table(s, {"arith": 40, "constant": 12, "drop_sync": 0}, width=None)
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.strip()}
    assert rows["arith"][:9] == ["arith", "40", "7", "1", "1", "1", "3", "1", "75.0%"]
    assert rows["drop_sync"][:6] == ["drop_sync", "0", "0", "0", "0", "0"]
    assert rows["all"][:3] == ["all", "52", "10"]
    waiting = report.op_table(s, {"arith": 40}, width=None, judged=False)
    assert "to run" in waiting and "score" not in waiting


def test_survivors_are_shown_as_their_diffs():
    text = report.survivors_text(MUTANTS)
    assert "survived u arith dddddddddddd at 3:4" in text and "--- x\n+++ y" in text
    assert "111111111111" in text and "aaaaaaaaaaaa" not in text


def test_kills_on_the_untimed_cases_alone_are_counted_apart():
    ms = [dict(m) for m in MUTANTS]
    killed = [m for m in ms if m["outcome"] == "killed"]
    killed[0]["screen"] = True
    s = report.summarize(ms)
    assert s["overall"]["killed_by_screen"] == 1 and s["overall"]["killed"] == 4
    assert report.summarize(MUTANTS)["overall"]["killed_by_screen"] == 0
