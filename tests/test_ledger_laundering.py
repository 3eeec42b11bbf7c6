"""Issue 27, item 6: ways to launder a forged ledger line through the user's own signing key.

A forger with no key writes bytes into ledger/ledger.jsonl; the user's next
`porter run` appends a correctly signed record after them. Each test shows the
forged line never becomes a record that status believes.
"""

from __future__ import annotations

import json

import pytest

from porter.records import signing
from porter.digest import sha256_bytes
from porter.errors import PorterError
from porter.records.ledger import canonical, utc_now
from test_signed_tamper import INIT, SYNC, forge_append, porter, signed_ws, status, unit
from ws_builder import TARGET


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)


def forged_line(ws, kind: str, **fields) -> tuple[dict, bytes]:
    """A line chained and self-hashed correctly, with a junk signature (the forger has no key)."""
    data = ws.ledger.path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    rec = {"seq": json.loads(last)["seq"] + 1, "time": utc_now(), "kind": kind, **fields, "prev": sha256_bytes(last)}
    rec["hash"] = sha256_bytes(canonical(rec))
    rec["sig"] = "ab" * 64
    return rec, canonical(rec)


def test_torn_tail_with_a_valid_hash_is_never_completed(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forged, line = forged_line(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    with open(ws.ledger.path, "ab") as f:
        f.write(line)  # no newline: what a crash mid-append would leave
    code, data = status(ws, capsys)
    assert code == 3, "status exits non-zero while a torn tail sits in the ledger"
    assert data["ledger"]["torn"] and "torn tail" in data["ledger"]["torn"][0]
    ws.ledger.append("usage", target=TARGET, provider="scripted", cost_usd=0.0)  # the user's next run
    hashes = [r["hash"] for r in ws.ledger.records()]
    assert forged["hash"] not in hashes
    repair = ws.ledger.records()[-2]
    assert repair["kind"] == "repair" and (ws.root / repair["torn_file"]).read_bytes() == line
    code, data = status(ws, capsys)
    assert unit(data, INIT)["state"] == "failing" and not data["ledger"]["torn"]


def test_signed_record_on_a_junk_signature_is_tampered(tmp_path, capsys):
    """What an older porter did after a forged complete line: sign on top of it. Only the last
    signature was checked, and it vouched for the forged line through `prev`."""
    ws = signed_ws(tmp_path)
    _, line = forged_line(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    with open(ws.ledger.path, "ab") as f:
        f.write(line + b"\n")
    forge_append(ws, "usage", signer=ws.signer, target=TARGET, provider="scripted", cost_usd=0.0)
    code, data = status(ws, capsys)
    assert code == 3
    n = len(ws.ledger.records()) - 1
    assert any(f"line {n} signature does not verify" in p for p in data["ledger"]["problems"])
    assert unit(data, INIT)["state"] == "tampered"


def test_writer_refuses_to_sign_on_a_junk_signature(tmp_path):
    ws = signed_ws(tmp_path)
    _, line = forged_line(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    with open(ws.ledger.path, "ab") as f:
        f.write(line + b"\n")
    before = ws.ledger.path.read_bytes()
    with pytest.raises(PorterError, match="does not verify"):
        ws.ledger.append("usage", target=TARGET, provider="scripted", cost_usd=0.0)
    assert ws.ledger.path.read_bytes() == before


def test_records_a_new_writer_appended_vouch_for_their_predecessor(tmp_path, capsys):
    """The cheaper scheme status relies on: a record porter signs carries prev_checked, so one
    valid signature vouches for the line before it; a legacy record without it does not."""
    ws = signed_ws(tmp_path)
    recs = ws.ledger.records()
    assert all(r.get("prev_checked") is True for r in recs[1:])
    code, _ = status(ws, capsys)
    assert code == 0


def test_duplicated_member_is_tampered(tmp_path, capsys):
    """A second "hash" and "state" in front of a signed built step: Python keeps the last (built),
    a first-key-wins parser reads "verified", and the hash still checks over the parsed record."""
    ws = signed_ws(tmp_path)
    step, _ = ws.port(SYNC, 2, state="built")
    data = ws.ledger.path.read_bytes()
    head, last = data.rstrip(b"\n").rsplit(b"\n", 1)
    assert json.loads(last)["state"] == "built"
    doubled = b'{"hash":"' + step["hash"].encode() + b'","state":"verified",' + last[1:]
    ws.ledger.path.write_bytes(head + b"\n" + doubled + b"\n")
    ws.commit_all("doubled members")
    code, data = status(ws, capsys)
    assert code == 3
    assert any("duplicated member" in p for p in data["ledger"]["problems"])


def test_no_key_named_but_history_had_one_is_tampered(tmp_path, capsys, monkeypatch):
    """Signatures stripped, chain recomputed, ledger/signer.pub removed; a reviewer with no pin and
    no witness: git still shows the workspace committed a signer.pub."""
    from test_signed_tamper import reviewer, rewrite_ledger

    ws = signed_ws(tmp_path)
    rewrite_ledger(ws, ws.ledger.records(), public_key="remove")
    reviewer(monkeypatch, tmp_path)
    code, data = status(ws, capsys)
    assert code == 3
    assert any("signer.pub" in p and "names no key" in p for p in data["ledger"]["problems"])
    assert not signing.load_workspace_key(ws.root)[0]


def test_porter_repair_moves_a_torn_tail_aside(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    _, line = forged_line(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    with open(ws.ledger.path, "ab") as f:
        f.write(line)
    assert porter(ws, "repair", "--reason", "torn tail after a crash") == 0
    capsys.readouterr()
    code, data = status(ws, capsys)
    assert code == 0 and not data["ledger"]["torn"]
