"""Status that cannot be faked (issue 11): each attack on a signed workspace is caught, with its exit code.

The workspace is signed as `porter init` signs it: an Ed25519 key pair under
PORTER_HOME (tmp, see conftest), its public half in ledger/signer.pub, every
record signed, the witness of the signed head kept under PORTER_HOME too.
Forgers below write the ledger bytes themselves (never through porter's Ledger,
which would also move the witness).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from porter import cli
from porter.records import signing
from porter.commands import status as status_mod
from porter.digest import sha256_bytes
from porter.records.evidence import store_evidence
from porter.records.ledger import ZERO, Ledger, canonical, utc_now
from ws_builder import SOURCES, TARGET, make_workspace

SWIGLU, ADD, SYNC, INIT = "mini_gpu_swiglu_tensor", "mini_gpu_add_tensor", "mini_gpu_synchronize", "mini_gpu_init"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)


def signed_ws(tmp_path):
    """Three verified units, one failing, everything committed, every record signed."""
    ws = make_workspace(tmp_path / "ws", signer=signing.create_private())
    ws.port(SWIGLU)
    ws.fail(ADD, 1)
    ws.port(ADD, 2)
    ws.port(SYNC)
    ws.fail(INIT, 1)
    ws.commit_all("failures so far")
    return ws


def status(ws, capsys):
    args = argparse.Namespace(workspace=ws.root, target=TARGET, json=True, reverify=False, source=None)
    code = status_mod.run(args)
    return code, json.loads(capsys.readouterr().out)


def unit(data, name):
    return next(u for u in data["units"] if u["unit"] == name)


def porter(ws, *args):
    return cli.main(["-C", str(ws.root), *args])


def run_scripted(ws, unit_name=SWIGLU):
    return porter(ws, "run", "--provider", "scripted", "--unit", unit_name, "--max-attempts", "1", "--quiet")


def forge_append(ws, kind: str, signer=None, **fields) -> dict:
    """Append one record the way a forger would: chain computed correctly, signed only if given a key."""
    data = ws.ledger.path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    rec = {"seq": json.loads(last)["seq"] + 1, "time": utc_now(), "kind": kind, **fields, "prev": sha256_bytes(last)}
    rec["hash"] = sha256_bytes(canonical(rec))
    if signer is not None:
        rec["sig"] = signer.sign(rec["hash"])
    ws.ledger.path.write_bytes(data + canonical(rec) + b"\n")
    return rec


def forged_step(ws, **extra) -> dict:
    cand = ws.write_unit(INIT, "// forged\n")
    return dict(target=TARGET, unit=INIT, attempt=7, state="verified", candidate_sha256=cand,
                unit_file=ws.rel(ws.unit_path(INIT)), evidence=[], **extra)


def rewrite_ledger(ws, records: list[dict], signer=None, public_key=None) -> None:
    """Rewrite the whole ledger from `records`: seq renumbered, chain recomputed, signed by `signer`
    (or not at all), then every commit's Porter-Step trailer rewritten to the new step hashes and the
    result committed, so that ledger, trailers and HEAD agree again."""
    out, old_to_new, prev = [], {}, ZERO
    for n, r in enumerate(records, 1):
        rec = {k: v for k, v in r.items() if k not in ("hash", "hmac", "sig", "prev", "seq")}
        rec["seq"], rec["prev"] = n, prev
        rec["hash"] = sha256_bytes(canonical(rec))
        if signer is not None:
            rec["sig"] = signer.sign(rec["hash"])
        line = canonical(rec)
        prev = sha256_bytes(line)
        if r["kind"] == "step":
            old_to_new[r["hash"]] = rec["hash"]
        out.append(line + b"\n")
    remap = ws.root.parent / "remap.py"
    remap.write_text("import sys\ns = sys.stdin.read()\n" + "".join(
        f"s = s.replace({a!r}, {b!r})\n" for a, b in old_to_new.items()) + "sys.stdout.write(s)\n")
    init = ws.repo.git.rev_list("--max-parents=0", "HEAD").strip()
    subprocess.run(["git", "filter-branch", "-f", "--msg-filter", f"{sys.executable} {remap}", f"{init}..HEAD"],
                   cwd=ws.root, check=True, capture_output=True, env={**os.environ, "FILTER_BRANCH_SQUELCH_WARNING": "1"})
    ws.ledger.path.write_bytes(b"".join(out))
    if public_key == "remove":
        signing.workspace_key_path(ws.root).unlink()
    elif public_key is not None:
        signing.write_workspace_key(ws.root, public_key)
    ws.commit_all("ledger")


def other_signer():
    return signing.Signer(Ed25519PrivateKey.generate())


def reviewer(monkeypatch, tmp_path, name="reviewer"):
    """A reviewer's machine: its own PORTER_HOME, no private key, no witness."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path / name))


# ---- baseline ------------------------------------------------------------------------


def test_signed_baseline_is_clean(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    code, data = status(ws, capsys)
    assert code == 0
    assert data["ledger"]["key"].startswith(f"signed (Ed25519 {ws.signer.fingerprint})")
    assert data["ledger"]["fingerprint"] == ws.signer.fingerprint and data["ledger"]["rolled_back"] == []
    assert all(isinstance(r.get("sig"), str) for r in ws.ledger.records())
    assert data["counts"]["verified"] == 3 and data["counts"]["tampered"] == 0


def test_porter_init_makes_the_key_outside_the_workspace(tmp_path, porter_cli):
    ws = tmp_path / "new"
    r = porter_cli(None, "init", ws)
    assert r.returncode == 0, r.stderr
    key = signing.private_key_path()
    assert key.is_file() and oct(key.stat().st_mode & 0o777) == "0o600"
    assert not signing._inside(key, ws)
    assert "PRIVATE" not in r.stdout + r.stderr  # never logged
    public, _ = signing.load_workspace_key(ws)
    assert signing.fingerprint(public) == signing.load_private().fingerprint
    # the same fingerprint the standard tool prints
    fp = subprocess.run(["ssh-keygen", "-l", "-f", str(ws / "ledger" / "signer.pub")], capture_output=True, text=True)
    if fp.returncode == 0:
        assert signing.fingerprint(public) in fp.stdout


# ---- forged records -------------------------------------------------------------------


def test_forged_unsigned_record(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forge_append(ws, "step", **forged_step(ws))
    code, data = status(ws, capsys)
    assert code == 3
    assert "is not signed after signed records" in data["ledger"]["problems"][0]
    assert unit(data, INIT)["state"] == "tampered" and unit(data, SWIGLU)["state"] == "verified"


def test_forged_record_signed_with_another_key(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forge_append(ws, "step", signer=other_signer(), **forged_step(ws))
    code, data = status(ws, capsys)
    assert code == 3
    assert f"signature does not verify with {ws.signer.fingerprint}" in data["ledger"]["problems"][0]
    assert unit(data, INIT)["state"] == "tampered" and unit(data, ADD)["state"] == "verified"


def test_key_absent_from_the_environment(tmp_path, capsys, monkeypatch):
    """Status needs no secret: a reviewer without the private key verifies, and still catches a forgery."""
    ws = signed_ws(tmp_path)
    signing.private_key_path().unlink()
    code, data = status(ws, capsys)
    assert code == 0 and data["ledger"]["key"].startswith("signed (Ed25519")
    reviewer(monkeypatch, tmp_path)
    code, data = status(ws, capsys)
    assert code == 0 and "not pinned" in data["ledger"]["key"]
    forge_append(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    code, data = status(ws, capsys)
    assert code == 3 and "is not signed after signed records" in data["ledger"]["problems"][0]


def test_signatures_stripped_chain_recomputed_trailers_rewritten(tmp_path, capsys, monkeypatch):
    ws = signed_ws(tmp_path)
    rewrite_ledger(ws, ws.ledger.records())  # every sig gone, chain and trailers consistent again
    code, data = status(ws, capsys)
    assert code == 3
    assert any("none of the" in p and "is signed" in p for p in data["ledger"]["problems"])
    # ... and with ledger/signer.pub removed too, the witness still knows the workspace was signed
    rewrite_ledger(ws, ws.ledger.records(), public_key="remove")
    code, data = status(ws, capsys)
    assert code == 3 and any("signing key changed since the witness" in p for p in data["ledger"]["problems"])
    # on a reviewer's machine (no witness) the pin catches it
    reviewer(monkeypatch, tmp_path)
    porter(ws, "trust", ws.signer.fingerprint)
    capsys.readouterr()
    code, data = status(ws, capsys)
    assert code == 3 and any("names no signing key" in p for p in data["ledger"]["problems"])


def test_key_swapped_in_the_repository_with_a_pinned_key(tmp_path, capsys, monkeypatch):
    ws = signed_ws(tmp_path)
    real = ws.signer.fingerprint
    swapper = other_signer()
    rewrite_ledger(ws, ws.ledger.records(), signer=swapper, public_key=swapper)  # fully consistent, another key
    reviewer(monkeypatch, tmp_path, "unpinned")
    code, data = status(ws, capsys)
    assert code == 0 and "not pinned" in data["ledger"]["key"]  # why a reviewer pins
    reviewer(monkeypatch, tmp_path, "pinned")
    assert porter(ws, "trust", real) == 0
    capsys.readouterr()
    code, data = status(ws, capsys)
    assert code == 3
    assert any(p.startswith(f"wrong key: the workspace's signing key {swapper.fingerprint} is not a key you trust")
               for p in data["ledger"]["problems"])
    assert data["counts"]["tampered"] == 0  # one key problem, not every unit


# ---- rollback and truncation ----------------------------------------------------------------


def test_git_reset_hard_is_rolled_back(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    ws.repo.git.reset("--hard", "HEAD~3")
    code, data = status(ws, capsys)
    assert code == 3
    assert data["ledger"]["problems"][0].startswith("rolled back: the ledger ends at seq")
    gone = " ".join(data["ledger"]["rolled_back"])
    assert ADD in gone and SYNC in gone and SWIGLU not in gone
    assert unit(data, ADD)["state"] == "tampered" and unit(data, ADD)["reason"].startswith("rolled back")


def test_failure_records_removed_and_chain_resigned(tmp_path, capsys):
    """Even with the real key (an insider), removing records is seen against the witness."""
    ws = signed_ws(tmp_path)
    kept = [r for r in ws.ledger.records() if not (r.get("unit") == ADD and r.get("attempt") == 1)]
    rewrite_ledger(ws, kept, signer=ws.signer)
    code, data = status(ws, capsys)
    assert code == 3 and data["ledger"]["rolled_back"]
    assert data["ledger"]["problems"][0].startswith("rolled back")


# ---- completeness ----------------------------------------------------------------------


def test_evidence_free_verified_step(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    step = ws.ledger.append("step", **forged_step(ws))  # signed with the real key: only completeness catches it
    ws.commit_step(step)
    code, data = status(ws, capsys)
    assert code == 3
    assert unit(data, INIT)["state"] == "tampered" and "has no attempt record behind it" in unit(data, INIT)["reason"]


def test_step_naming_evidence_no_gate_record_holds(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    src = SOURCES[SWIGLU].replace("swiglu_kernel", "init_like")
    cand = ws.write_unit(INIT, src)
    ws.attempt(INIT, 2, src)
    ev = store_evidence(ws.root, {"target": TARGET, "unit": INIT, "gate": "parity", "ok": True,
                                  "candidate_sha256": cand, "toolchain": {}})
    step = ws.ledger.append("step", target=TARGET, unit=INIT, attempt=2, state="verified", candidate_sha256=cand,
                            unit_file=ws.rel(ws.unit_path(INIT)), evidence=[ev])
    ws.commit_step(step)
    code, data = status(ws, capsys)
    assert code == 3 and "that no gate record of its attempt holds" in unit(data, INIT)["reason"]


# ---- wrong key --------------------------------------------------------------------------


def test_wrong_key_is_reported_as_a_wrong_key(tmp_path, capsys, monkeypatch):
    ws = signed_ws(tmp_path)
    real = ws.signer.fingerprint
    signing.private_key_path().unlink()
    mine = signing.create_private()  # this user now holds another key
    code, data = status(ws, capsys)
    assert code == 0 and any(n.startswith(f"wrong key: your signing key is {mine.fingerprint}") for n in data["notes"])
    assert run_scripted(ws) == 3
    assert f"wrong key: this workspace's ledger is signed by {real}" in capsys.readouterr().err
    # a reviewer who pinned another key: one problem saying so, not 24 tampered units
    reviewer(monkeypatch, tmp_path)
    porter(ws, "trust", mine.fingerprint)
    capsys.readouterr()
    code, data = status(ws, capsys)
    assert code == 3 and data["counts"]["tampered"] == 0
    assert data["ledger"]["problems"][0].startswith(f"wrong key: the workspace's signing key {real}")


# ---- exit codes, run refusal, repair ---------------------------------------------------------------


def test_stale_unit_has_its_own_exit_code(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    ws.write_unit(ADD, SOURCES[ADD].replace("a[i] + b[i]", "a[i] - b[i]"))
    code, data = status(ws, capsys)
    assert code == status_mod.EXIT_STALE == 4 and unit(data, ADD)["state"] == "stale"
    forge_append(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    assert status(ws, capsys)[0] == 3  # tampering outranks staleness


def test_run_refuses_a_tampered_workspace(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forge_append(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    before = ws.ledger.read_bytes()
    assert run_scripted(ws) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("porter: error: workspace tampered, not starting:")
    assert ws.ledger.read_bytes() == before  # nothing written over the evidence


def test_run_refuses_a_rolled_back_workspace(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    ws.repo.git.reset("--hard", "HEAD~3")
    assert run_scripted(ws) == 3
    assert "workspace rolled back, not starting" in capsys.readouterr().err


def test_repair_a_forged_tail_then_run(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forged = forge_append(ws, "step", **forged_step(ws))
    ws.write_unit(INIT, "// porter:placeholder\n")
    assert porter(ws, "repair", "--reason", "forged step appended by hand") == 0
    out = capsys.readouterr().out
    assert "moved ledger lines" in out
    records = ws.ledger.records()
    repair = records[-1]
    assert repair["kind"] == "repair" and signing.verify(signing.load_workspace_key(ws.root)[0], repair["hash"], repair["sig"])
    quarantined = (ws.root / repair["quarantined_file"]).read_bytes()
    assert json.loads(quarantined)["hash"] == forged["hash"] and sha256_bytes(quarantined) == repair["quarantined_sha256"]
    code, data = status(ws, capsys)
    assert code == 0 and data["counts"]["verified"] == 3
    assert run_scripted(ws) == 0


def test_repair_a_rollback_then_run(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    ws.repo.git.reset("--hard", "HEAD~3")
    assert porter(ws, "repair", "--reason", "reset by mistake; redo the lost units") == 0
    assert "accepted the rollback" in capsys.readouterr().out
    lost = ws.ledger.records()[-1]
    assert lost["accepted"] == "rollback" and any(ADD in x for x in lost["lost"])
    code, data = status(ws, capsys)
    assert code == 0 and unit(data, SWIGLU)["state"] == "verified" and unit(data, ADD)["state"] == "unported"
    assert run_scripted(ws) == 0


def test_repair_refuses_what_it_cannot_accept(tmp_path, capsys):
    ws = signed_ws(tmp_path)
    forge_append(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    ws.commit_all("forgery committed")
    assert porter(ws, "repair", "--reason", "x") == 3
    assert "is committed at HEAD" in capsys.readouterr().err


def test_hmac_ledger_with_stripped_hmacs_is_tampered(tmp_path, capsys, monkeypatch):
    """The legacy HMAC mode cannot be downgraded: a key set over unsigned lines is not 'UNKEYED'."""
    ws = make_workspace(tmp_path / "ws", b"k")
    ws.port(SWIGLU)
    rewrite_ledger(ws, ws.ledger.records())
    monkeypatch.setenv("PORTER_LEDGER_KEY", "k")
    code, data = status(ws, capsys)
    assert code == 3 and "carries an HMAC" in data["ledger"]["problems"][0]
    monkeypatch.delenv("PORTER_LEDGER_KEY")
    forge_append(ws, "exhausted", target=TARGET, unit=INIT, attempts=1)
    ws2 = make_workspace(tmp_path / "ws2", b"k")
    ws2.port(SWIGLU)
    forge_append(ws2, "exhausted", target=TARGET, unit=INIT, attempts=1)
    code, data = status(ws2, capsys)  # no key in the environment: the missing HMAC is still visible
    assert code == 3 and "has no HMAC after signed records" in data["ledger"]["problems"][0]


def test_commits_are_signed_with_the_ledger_key(tmp_path, workspace):
    """Step commits (and the init commit) carry git SSH signatures by the ledger key: `git verify-commit`
    accepts them with an allowed-signers file naming ledger/signer.pub, and refuses them under another key."""
    from porter.records import gitops

    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not on PATH: git cannot make SSH signatures here")
    (workspace / "ledger" / "note.txt").write_text("x")
    sha = gitops.commit_paths(workspace, ["ledger"], "porter: test\n\nPorter-Run: t\n")
    allowed = tmp_path / "allowed_signers"

    def verify(rev):
        return subprocess.run(["git", "-c", f"gpg.ssh.allowedSignersFile={allowed}", "verify-commit", rev],
                              cwd=workspace, capture_output=True, text=True).returncode

    allowed.write_text(gitops.allowed_signers_line(workspace) + "\n")
    assert verify(sha) == 0 and verify(f"{sha}~1") == 0
    allowed.write_text("porter@ledger " + signing.openssh_line(other_signer().public) + "\n")
    assert verify(sha) != 0
