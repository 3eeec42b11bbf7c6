"""Issue 27, item 6 and 7: what status must see (witness, commits, evidence, the API header), what it
must not mistake for tampering (a run in flight), and what it must never execute (workspace code)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import threading

import pytest

from porter.commands import status as status_mod
from porter.records import witness
from porter.commands.status import derive
from test_signed_tamper import ADD, INIT, SWIGLU, SYNC, porter, reviewer, signed_ws, status, unit
from ws_builder import TARGET


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)


def witness_file(ws):
    return witness.witness_dir() / f"{ws.ledger.records()[0]['hash'][:32]}.json"


def text_status(ws, capsys):
    args = argparse.Namespace(workspace=ws.root, target=TARGET, json=False, reverify=False, source=None, wide=True)
    code = status_mod.run(args)
    return code, capsys.readouterr().out


# ---- the witness --------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "empty", "corrupt"])
def test_damaged_witness_is_said_first_and_exits_3(tmp_path, capsys, damage):
    ws = signed_ws(tmp_path)
    path = witness_file(ws)
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"" if damage == "empty" else b'{"seq": 7, "hash": ')
    code, data = status(ws, capsys)
    assert code == 3 and data["ledger"]["witness"]["state"] == damage
    code, out = text_status(ws, capsys)
    assert code == 3 and out.splitlines()[0].startswith(f"witness: {damage.upper()}")


def test_rollback_after_deleting_the_whole_witness_is_caught(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    shutil.rmtree(witness.witness_dir())
    ws.repo.git.reset("--hard", "HEAD~3")
    code, data = status(ws, capsys)
    assert code == 3 and data["ledger"]["witness"]["state"] == "missing"


def test_reviewer_without_a_witness_is_told_and_not_failed(tmp_path, capsys, monkeypatch):
    ws = signed_ws(tmp_path)
    reviewer(monkeypatch, tmp_path)
    code, data = status(ws, capsys)
    assert code == 0 and data["ledger"]["witness"]["state"] == "none"
    code, out = text_status(ws, capsys)
    assert code == 0 and out.splitlines()[0].startswith("witness: none")


# ---- commits, refused evidence, the API header, evidence files -----------------------------------


def test_empty_commits_carrying_the_right_trailers_are_tampered(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    init = ws.repo.git.rev_list("--max-parents=0", "HEAD").strip()
    messages = [ws.repo.git.log("-1", "--format=%B", sha) for sha in ws.repo.git.rev_list("--reverse", "HEAD").split()
                if "Porter-Step:" in ws.repo.git.log("-1", "--format=%B", sha)]
    ws.repo.git.reset("--mixed", init)
    for msg in messages:
        ws.repo.git.commit("--allow-empty", "-q", "-m", msg)
    ws.repo.git.add("ledger")
    ws.repo.git.commit("-q", "-m", "ledger")
    code, data = status(ws, capsys)
    assert code == 3
    assert "does not hold" in unit(data, SWIGLU)["reason"] and unit(data, SWIGLU)["state"] == "tampered"


def test_refused_attempts_evidence_is_hash_checked(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    gate = next(r for r in ws.ledger.records() if r["kind"] == "gate" and r["unit"] == INIT)
    path = ws.root / "ledger" / "evidence" / f"{gate['evidence']}.json"
    path.write_text(path.read_text().replace('"ok":false', '"ok":true'))
    code, data = status(ws, capsys)
    assert code == 3 and unit(data, INIT)["state"] == "tampered" and "edited or swapped" in unit(data, INIT)["reason"]


def test_unit_whose_declaration_left_the_api_header_is_reported(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    header = ws.target.dir / "mini_gpu.h"
    header.write_text("".join(line for line in header.read_text().splitlines(keepends=True)
                              if not line.startswith(f"int {SYNC}(")))
    code, data = status(ws, capsys)
    row = unit(data, SYNC)
    assert row["state"] == "stale" and "API header" in row["reason"]
    assert code == 4


def test_evidence_that_is_a_symlink_to_dev_zero_is_tampered(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    sha = next(r for r in ws.ledger.records() if r["kind"] == "step" and r["unit"] == SWIGLU)["evidence"][0]
    path = ws.root / "ledger" / "evidence" / f"{sha}.json"
    path.unlink()
    path.symlink_to("/dev/zero")
    code, data = status(ws, capsys)
    assert code == 3 and unit(data, SWIGLU)["state"] == "tampered"
    assert "not a regular file" in unit(data, SWIGLU)["reason"]


# ---- a run in flight is not tampering -----------------------------------------------------------


def advance(ws, n=[0]):
    """One step of a run as porter makes it: records appended (witness moves), then the commit."""
    n[0] += 1
    ws.fail(INIT, 10 + n[0])
    ws.commit_all(f"run progress {n[0]}")


def test_commit_landing_between_status_reads_is_not_tampering(tmp_path, monkeypatch):
    """A run commits the ledger while status reads: the ledger as read must not look rewritten."""
    ws = signed_ws(tmp_path)
    real = status_mod.read_git

    def run_commits_now(*a, **k):
        advance(ws)
        return real(*a, **k)

    monkeypatch.setattr(status_mod, "read_git", run_commits_now)
    r = derive(ws.root, TARGET)
    assert not r.tampered and r.exit_code == 0, r.ledger["problems"] + r.problems


def test_append_between_ledger_and_witness_reads_is_not_a_rollback(tmp_path, monkeypatch):
    """A run appends (and moves the witness) after status read the ledger, before it read the
    witness; status must read both as one snapshot (the writer waits for it, or went before it)."""
    ws = signed_ws(tmp_path)
    real = witness.load

    def run_appends_now(*a, **k):
        t = threading.Thread(target=ws.fail, args=(INIT, 20))
        t.start()
        t.join(1.0)  # blocked by status's shared lock when status reads a snapshot
        return real(*a, **k)

    monkeypatch.setattr(witness, "load", run_appends_now)
    r = derive(ws.root, TARGET)
    monkeypatch.setattr(witness, "load", real)
    assert not r.tampered, r.ledger["problems"] + r.problems


def test_status_during_a_writing_process_never_reports_tampering(tmp_path):
    """The measured case: status called over and over while another process appends and commits."""
    ws = signed_ws(tmp_path)
    writer = subprocess.Popen(
        ["python3", "-c", (
            "import sys; sys.path.insert(0, 'tests')\n"
            "from ws_builder import Workspace\nfrom porter.records import signing\nfrom pathlib import Path\n"
            f"ws = Workspace(Path({str(ws.root)!r}), None, signing.load_private())\n"
            "for i in range(30):\n"
            f"    ws.fail({INIT!r}, 100 + i); ws.commit_all(f'progress {{i}}')\n")],
        env={**os.environ}, cwd=os.path.dirname(os.path.dirname(__file__)))
    bad = []
    try:
        while writer.poll() is None:
            r = derive(ws.root, TARGET, use_static=False, rank=False)
            if r.tampered:
                bad.append(r.ledger["problems"] + r.problems)
    finally:
        writer.wait(60)
    assert writer.returncode == 0
    assert not bad, bad[0]


# ---- reviewer safety ----------------------------------------------------------------------------


def test_status_and_report_execute_no_workspace_code(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    marker = tmp_path / "spec-ran"
    planted = ws.target.dir / "parity" / f"{SYNC}.py"
    planted.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + planted.read_text())
    assert porter(ws, "status", "--json") == 0
    assert porter(ws, "report", "--out", str(tmp_path / "site")) == 0
    capsys.readouterr()
    assert not marker.exists(), "status or report imported the workspace's spec Python"


def test_reverify_says_it_runs_the_workspaces_specs(tmp_path, capsys, monkeypatch):
    ws = signed_ws(tmp_path)
    from porter.commands.reverify import Reverdict

    # the statement is what is tested, not the gates (test_status_reverify runs them with nvcc)
    monkeypatch.setattr(status_mod, "reverify", lambda target, **kw: [Reverdict(SYNC, ["static ok"], True, "ok")])
    args = argparse.Namespace(workspace=ws.root, target=TARGET, json=False, reverify=True, source=None, wide=True)
    status_mod.run(args)
    out = capsys.readouterr().out
    assert status_mod.REVERIFY_SAYS in out and "only inside the sandbox" in out
