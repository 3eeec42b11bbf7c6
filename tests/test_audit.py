"""`porter audit UNIT`: Metal side, CUDA now, the step commit's diff, every attempt."""

from __future__ import annotations

import argparse
import json

import pytest

from porter.commands import audit as audit_mod
from porter.errors import PorterError
from ws_builder import TARGET, make_workspace

UNIT = "mini_gpu_swiglu_tensor"

FAKE_HOST = """#import <Metal/Metal.h>
#include "mini_gpu.h"

static id<MTLComputePipelineState> g_swiglu;

int mini_gpu_swiglu_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *gate,
                           const mini_gpu_tensor *up, uint64_t n) {
    id<MTLComputeCommandEncoder> enc = [g_cb computeCommandEncoder];
    [enc setComputePipelineState:g_swiglu];
    [enc dispatchThreads:MTLSizeMake(n, 1, 1) threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    return 0;
}
"""


@pytest.fixture(autouse=True)
def _no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def ws(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    host = ws.target.metal_host
    if not host.exists():  # the bundled target's host file may not be written yet
        host.write_text(FAKE_HOST)
    ws.fail(UNIT, 1, gate="build", summary="nvcc: 1 error", diagnostics="kernel.cu(3): error: identifier \"x\" is undefined\n1 error detected\n")
    ws.fail(UNIT, 2, gate="static", summary="stub body: it only returns -1")
    ws.port(UNIT, 3)
    return ws


def args(ws, unit=UNIT, json_out=True):
    return argparse.Namespace(workspace=ws.root, target=TARGET, unit=unit, json=json_out, source=None)


def test_audit_json(ws, capsys):
    assert audit_mod.run(args(ws)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unit"] == UNIT and data["state"] == "verified"
    assert data["signature"].startswith("int mini_gpu_swiglu_tensor(")

    host = data["metal"]["host"]
    assert host["text"] and UNIT in host["text"] and host["text"].lstrip().startswith("int")
    assert host["lines"][0] <= host["lines"][1]
    kernels = data["metal"]["kernels"]
    assert kernels["text"] or kernels["note"]

    assert data["cuda"]["path"] == f"targets/minimoe/ported/{UNIT}.cu"
    assert "swiglu_kernel<<<" in data["cuda"]["text"]

    commit = data["commit"]
    assert commit and f"Porter-Unit: {UNIT}" in commit["message"]
    assert f"+++ b/targets/minimoe/ported/{UNIT}.cu" in commit["diff"]
    assert "ledger/ledger.jsonl" in commit["files"]

    attempts = data["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    first = attempts[0]
    assert first["gates"][0]["gate"] == "build" and first["gates"][0]["ok"] is False
    diag = first["failures"][0]["diagnostics"]
    assert diag["kept"] and diag["intact"] and "is undefined" in diag["excerpt"]
    assert attempts[1]["failures"][0]["summary"].startswith("stub body")
    assert [g["gate"] for g in attempts[2]["gates"]] == ["static", "build", "parity", "perf"]
    assert attempts[2]["steps"][0]["state"] == "verified"


def test_audit_text(ws, capsys):
    assert audit_mod.run(args(ws, json_out=False)) == 0
    out = capsys.readouterr().out
    for needle in ("audit minimoe/mini_gpu_swiglu_tensor", "state: verified", "Metal host function", "CUDA now",
                   "attempts (3)", "build: FAILED", "is undefined", "step: verified"):
        assert needle in out, needle


def test_edited_diagnostics_are_flagged(ws):
    diag = next((ws.root / "runs" / "diagnostics").glob("*.txt"))
    diag.write_text("all good\n")
    data = audit_mod.audit(ws.root, TARGET, UNIT)
    assert data["attempts"][0]["failures"][0]["diagnostics"]["intact"] is False


def test_unported_unit_and_missing_host(ws):
    ws.target.metal_host.unlink()
    data = audit_mod.audit(ws.root, TARGET, "mini_gpu_add_tensor")
    assert data["state"] == "unported" and data["commit"] is None and data["attempts"] == []
    assert data["metal"]["host"]["text"] is None and "not found" in data["metal"]["host"]["note"]


def test_host_function_is_found_by_parsing(ws):
    ws.target.metal_host.write_text(FAKE_HOST)
    got = audit_mod.host_function(ws.target, UNIT)
    assert got["lines"] == [6, 12] and got["text"].endswith("}")
    assert "defines no function" in audit_mod.host_function(ws.target, "mini_gpu_add_tensor")["note"]


def test_unknown_unit(ws):
    with pytest.raises(PorterError, match="unknown unit"):
        audit_mod.run(args(ws, unit="mini_gpu_nope"))


def test_tampered_unit_exits_3(ws, capsys):
    from porter.records.evidence import evidence_path

    data = audit_mod.audit(ws.root, TARGET, UNIT)
    p = evidence_path(ws.root, data["evidence"][-1])
    p.write_bytes(p.read_bytes() + b" ")
    assert audit_mod.run(args(ws)) == 3
    assert json.loads(capsys.readouterr().out)["state"] == "tampered"


def test_add_arguments():
    p = argparse.ArgumentParser()
    audit_mod.add_arguments(p)
    a = p.parse_args([UNIT, "--json"])
    assert a.unit == UNIT and a.json


def test_ledger_text_is_not_rich_markup(ws, capsys):
    ws.fail("mini_gpu_add_tensor", 1, gate="parity", summary="parity not run: pip install 'porter[gpu]'")
    assert audit_mod.run(args(ws, unit="mini_gpu_add_tensor", json_out=False)) == 0
    assert "porter[gpu]" in capsys.readouterr().out
