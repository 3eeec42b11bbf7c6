"""The ledger: format, chain, HMAC, torn-tail repair, locking, key loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from porter.records import ledger as ledger_mod
from porter.errors import PorterError
from porter.digest import sha256_bytes
from porter.records.ledger import ZERO, Ledger, canonical, chain_hmac, load_key, record_hash

KEY = b"test-key-kept-outside"


def lines(led: Ledger) -> list[bytes]:
    return led.path.read_bytes().split(b"\n")[:-1]


def write_lines(led: Ledger, raw: list[bytes]) -> None:
    led.path.write_bytes(b"".join(line + b"\n" for line in raw))


def fill(led: Ledger, n: int = 5) -> list[dict]:
    return [led.append("attempt", target="minimoe", unit=f"u{i % 2}", attempt=i) for i in range(1, n + 1)]


def test_record_format_and_chain(tmp_path):
    led = Ledger(tmp_path)
    recs = fill(led, 3)
    raw = lines(led)
    assert [r["seq"] for r in recs] == [1, 2, 3]
    assert recs[0]["prev"] == ZERO
    assert recs[1]["prev"] == sha256_bytes(raw[0])
    assert recs[2]["prev"] == sha256_bytes(raw[1])
    for r, line in zip(recs, raw):
        assert r["hash"] == record_hash(r)
        assert "hmac" not in r
        assert line == canonical(r)  # each line is the canonical JSON of its record
        assert r["time"].endswith("Z") and r["kind"] == "attempt" and r["unit"] in ("u0", "u1")
    assert led.records() == recs
    integ = led.verify()
    assert integ.ok and integ.records == 3 and not integ.keyed
    assert "UNKEYED" in integ.summary() and "chain ok" in integ.summary()


def test_keyed_chain(tmp_path):
    led = Ledger(tmp_path, KEY)
    recs = fill(led, 3)
    assert recs[0]["hmac"] == chain_hmac(KEY, ZERO, recs[0]["hash"])
    assert recs[1]["hmac"] == chain_hmac(KEY, recs[0]["hmac"], recs[1]["hash"])
    integ = led.verify()
    assert integ.ok and integ.keyed and integ.summary() == "ledger: 3 records, chain ok, HMAC-keyed"
    # read without the key: the chain still verifies, but nothing vouches for the HMACs
    plain = Ledger(tmp_path).verify()
    assert plain.ok and not plain.keyed and "no key is available" in plain.summary()
    # the wrong key is reported once, as a wrong key (not as every line tampered)
    wrong = Ledger(tmp_path, b"other").verify()
    assert not wrong.ok and wrong.problems[0].startswith("wrong HMAC key") and not wrong.bad_lines


def test_reserved_fields_refused(tmp_path):
    led = Ledger(tmp_path)
    for name in ("seq", "hash", "prev", "hmac", "time"):
        with pytest.raises(ValueError):
            led.append("attempt", **{name: 1})
    with pytest.raises(ValueError):
        led.append("")


def test_appends_fsync_the_file_and_new_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(ledger_mod.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    led = Ledger(tmp_path)
    led.append("attempt", unit="u")
    assert len(synced) >= 2  # the new ledger's directory and the file
    synced.clear()
    led.append("attempt", unit="u")
    assert len(synced) == 1


def test_edited_line_detected(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 5)
    raw = lines(led)
    rec = json.loads(raw[2])
    rec["attempt"] = 99
    raw[2] = canonical(rec)
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok
    assert integ.problems[0].startswith("line 3 edited (hash mismatch")
    assert 3 in integ.bad_lines and len(integ.problems) == 1  # line 4's broken prev is the same edit
    assert "TAMPERED: line 3 edited" in integ.summary()


def test_edited_line_with_recomputed_hash_detected(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 5)
    raw = lines(led)
    rec = json.loads(raw[1])
    rec["attempt"] = 42
    rec["hash"] = record_hash(rec)
    raw[1] = canonical(rec)
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok and "line 3 does not chain to line 2" in integ.problems[0]


def test_deleted_line_detected(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 6)
    raw = lines(led)
    del raw[3]
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok and integ.problems == ["record seq 4 deleted before line 4"]


def test_deleted_first_line_detected(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 3)
    write_lines(led, lines(led)[1:])
    integ = led.verify()
    assert not integ.ok and "seq 1 deleted" in integ.problems[0]


def test_reordered_lines_detected(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 6)
    raw = lines(led)
    raw[2], raw[3] = raw[3], raw[2]
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok and any("reordered" in p for p in integ.problems)


def test_unkeyed_forgery_with_recomputed_chain_is_undetectable_and_said_so(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 3)
    Ledger(tmp_path).append("step", unit="u0", state="verified")  # anyone can do this
    integ = led.verify()
    assert integ.ok and not integ.keyed
    assert "cannot be told apart" in integ.summary()


def test_forged_append_without_key_detected_in_keyed_ledger(tmp_path):
    led = Ledger(tmp_path, KEY)
    fill(led, 3)
    Ledger(tmp_path).append("step", unit="u0", state="verified")
    integ = led.verify()
    assert not integ.ok and "line 4 has no HMAC after signed records" in integ.problems[0]
    Ledger(tmp_path, b"guessed").append("step", unit="u0", state="verified")
    assert any("line 5 HMAC mismatch" in p for p in led.verify().problems)


def test_key_added_later(tmp_path):
    fill(Ledger(tmp_path), 2)
    keyed = Ledger(tmp_path, KEY)
    integ = keyed.verify()
    # a key set over an unsigned ledger is what stripped HMACs look like: not accepted until a signed append
    assert not integ.ok and "none of the 2 records carries an HMAC" in integ.summary()
    keyed.append("attempt", unit="u0", attempt=3)
    integ = keyed.verify()
    assert integ.ok and integ.keyed and "HMAC-keyed from line 3" in integ.summary()
    # the unsigned prefix is covered by the chain into the first signed line
    raw = lines(keyed)
    rec = json.loads(raw[0])
    rec["unit"] = "forged"
    rec["hash"] = record_hash(rec)
    raw[0] = canonical(rec)
    rec1 = json.loads(raw[1])
    rec1["prev"] = sha256_bytes(raw[0])
    rec1["hash"] = record_hash(rec1)
    raw[1] = canonical(rec1)
    write_lines(keyed, raw)  # chain recomputed up to the signed line, which now breaks
    assert not keyed.verify().ok


def test_unreadable_middle_line_is_a_problem(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 3)
    raw = lines(led)
    raw[1] = b"garbage"
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok and "line 2 is not a ledger record" in integ.problems[0]


# ---- torn tail -----------------------------------------------------------------


def test_torn_tail_detected_and_repaired_keeping_the_bytes(tmp_path):
    led = Ledger(tmp_path, KEY)
    fill(led, 3)
    torn = b'{"seq":4,"time":"2026-01-01T00:00:00Z","kind":"gate","un'
    with open(led.path, "ab") as f:
        f.write(torn)
    integ = led.verify()
    assert integ.ok and integ.records == 3 and "torn tail" in integ.torn[0]
    assert len(led.records()) == 3

    rec = led.append("gate", unit="u0", attempt=3, gate="build", ok=True)
    torn_files = list((tmp_path / "ledger").glob("torn-*.jsonl.part"))
    assert len(torn_files) == 1 and torn_files[0].read_bytes() == torn
    recs = led.records()
    assert [r["kind"] for r in recs] == ["attempt"] * 3 + ["repair", "gate"]
    repair = recs[3]
    assert repair["torn_file"] == f"ledger/{torn_files[0].name}"
    assert repair["torn_bytes"] == len(torn) and repair["torn_sha256"] == sha256_bytes(torn)
    assert rec["seq"] == 5
    integ = led.verify()
    assert integ.ok and integ.keyed and not integ.notes


def test_unreadable_last_line_is_torn(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 2)
    with open(led.path, "ab") as f:
        f.write(b'{"seq":3,"kind":\n')
    assert led.verify().ok
    assert led.repair_torn_tail() is True
    assert led.repair_torn_tail() is False
    part = next((tmp_path / "ledger").glob("torn-*.jsonl.part"))
    assert part.read_bytes() == b'{"seq":3,"kind":\n'
    assert [r["kind"] for r in led.records()] == ["attempt", "attempt", "repair"]
    assert led.verify().ok


def test_whole_record_missing_its_newline_is_moved_aside_not_completed(tmp_path):
    """Its bytes hash right, but anyone can write such a line: completing it would make it a record
    the next append chains onto (issue 27's laundering)."""
    led = Ledger(tmp_path)
    fill(led, 2)
    whole = led.path.read_bytes()
    led.path.write_bytes(whole[:-1])
    assert led.repair_torn_tail() is True
    part = next((tmp_path / "ledger").glob("torn-*.jsonl.part"))
    assert part.read_bytes() == whole[:-1].rsplit(b"\n", 1)[-1]
    assert [r["kind"] for r in led.records()] == ["attempt", "repair"]
    assert led.verify().ok


def test_orphan_torn_file_gets_recorded(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 2)
    (tmp_path / "ledger" / "torn-20260101T000000Z.jsonl.part").write_bytes(b"half a line")
    led.append("attempt", unit="u0", attempt=3)
    recs = led.records()
    assert recs[2]["kind"] == "repair" and recs[2]["torn_file"] == "ledger/torn-20260101T000000Z.jsonl.part"
    led.append("attempt", unit="u0", attempt=4)
    assert sum(r["kind"] == "repair" for r in led.records()) == 1


def test_empty_ledger(tmp_path):
    led = Ledger(tmp_path)
    assert led.records() == [] and led.verify().ok and led.verify().records == 0
    assert led.repair_torn_tail() is False


# ---- concurrency ------------------------------------------------------------------


def test_two_processes_appending_keep_the_chain(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        from porter.records.ledger import Ledger
        led = Ledger(sys.argv[1], b"k")
        for i in range(150):
            led.append("attempt", unit=sys.argv[2], attempt=i, padding="x" * (i % 7) * 300)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name], env=env) for name in ("a", "b")
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    led = Ledger(tmp_path, b"k")
    integ = led.verify()
    assert integ.ok and integ.keyed and integ.records == 300
    recs = led.records()
    assert [r["seq"] for r in recs] == list(range(1, 301))
    assert sorted(r["attempt"] for r in recs if r["unit"] == "a") == list(range(150))


# ---- key loading --------------------------------------------------------------------


@pytest.fixture
def no_key_env(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_load_key_env(no_key_env, monkeypatch, tmp_path):
    assert load_key(tmp_path / "ws") is None
    monkeypatch.setenv("PORTER_LEDGER_KEY", "sekrit")
    assert load_key(tmp_path / "ws") == b"sekrit"


def test_load_key_file_outside_and_default_path(no_key_env, monkeypatch, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    default = tmp_path / "home" / ".config" / "porter" / "ledger.key"
    default.parent.mkdir(parents=True)
    default.write_bytes(b"from-home\n")
    assert load_key(ws) == b"from-home"
    other = tmp_path / "k.key"
    other.write_bytes(b"named\n")
    monkeypatch.setenv("PORTER_LEDGER_KEY_FILE", str(other))
    assert load_key(ws) == b"named"


def test_key_file_inside_workspace_refused(no_key_env, monkeypatch, tmp_path):
    ws = tmp_path / "ws"
    (ws / "ledger").mkdir(parents=True)
    inside = ws / "ledger" / "ledger.key"
    inside.write_bytes(b"oops")
    monkeypatch.setenv("PORTER_LEDGER_KEY_FILE", str(inside))
    with pytest.raises(PorterError) as exc:
        load_key(ws)
    assert "inside the workspace" in str(exc.value) and "\n" not in str(exc.value)


def test_missing_named_key_file_is_an_error(no_key_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PORTER_LEDGER_KEY_FILE", str(tmp_path / "nope"))
    with pytest.raises(PorterError):
        load_key(tmp_path)


def test_whitespace_only_edit_is_an_edit(tmp_path):
    led = Ledger(tmp_path)
    fill(led, 3)
    raw = lines(led)
    raw[2] = raw[2].replace(b',"kind":', b', "kind":')  # same JSON content, different bytes
    write_lines(led, raw)
    integ = led.verify()
    assert not integ.ok and integ.problems[0].startswith("line 3 edited")


def test_nested_hash_like_fields_verify(tmp_path):
    led = Ledger(tmp_path, KEY)
    led.append("reconcile", step="ab" * 32, meta={"hash": "cd" * 32, "hmac": "x"})
    led.append("attempt", unit="u", attempt=1)
    integ = led.verify()
    assert integ.ok and integ.keyed


def test_appends_after_a_repair_do_not_reread_the_ledger(tmp_path, monkeypatch):
    led = Ledger(tmp_path)
    fill(led, 2)
    with open(led.path, "ab") as f:
        f.write(b'{"torn')
    led.append("attempt", unit="u0", attempt=3)
    calls = []
    real = Ledger.records
    monkeypatch.setattr(Ledger, "records", lambda self: (calls.append(1), real(self))[1])
    for i in range(5):
        led.append("attempt", unit="u0", attempt=4 + i)
    assert len(calls) == 0
    fresh = Ledger(tmp_path)  # a new process reads once, then remembers
    fresh.append("attempt", unit="u0", attempt=10)
    fresh.append("attempt", unit="u0", attempt=11)
    assert len(calls) == 1
    assert fresh.verify().ok
