"""`porter status`: every state derived from ledger + evidence + git + current files."""

from __future__ import annotations

import argparse
import io
import json

import types

import pytest
from rich.console import Console

from porter.commands import status as status_mod
from porter.errors import PorterError
from porter.gates.result import GateResult
from porter.commands.status import STATES, derive, render
from ws_builder import SOURCES, STUB, TARGET, make_workspace


@pytest.fixture(autouse=True)
def _no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path / "ws")


def state(report, unit):
    u = report.unit(unit)
    return u.state, u.reason


def run_status(ws, *, json_out=True, capsys=None, **extra):
    args = argparse.Namespace(workspace=ws.root, target=TARGET, json=json_out, reverify=False, source=None, **extra)
    code = status_mod.run(args)
    out = capsys.readouterr().out if capsys else None
    return code, out


def test_fresh_workspace_is_all_unported(ws):
    r = derive(ws.root, TARGET)
    assert r.counts["unported"] == 24 and r.counts["total"] == 24
    assert all(u.reason == "placeholder, no attempt" for u in r.units)
    assert r.ledger["ok"] and r.ledger["records"] == 0 and r.exit_code == 0


def test_each_state(ws):
    ws.port("mini_gpu_synchronize")  # verified
    ws.port("mini_gpu_tensor_bytes", state="built")
    ws.fail("mini_gpu_swiglu_tensor", 1)
    ws.fail("mini_gpu_swiglu_tensor", 2, gate="static", summary="stub body: it only returns -1")
    ws.fail("mini_gpu_add_tensor", 1)
    ws.exhaust("mini_gpu_add_tensor", 1)
    ws.write_unit("mini_gpu_tensor_free", '#include "mini_cuda.cuh"\nextern "C" void mini_gpu_tensor_free(mini_gpu_tensor *t) { if (t) { if (t->owner) cudaFree(t->data); delete t; } }\n')
    ws.unit_path("mini_gpu_init").unlink()
    r = derive(ws.root, TARGET)

    assert state(r, "mini_gpu_synchronize")[0] == "verified"
    assert "parity evidence" in state(r, "mini_gpu_synchronize")[1]
    assert r.unit("mini_gpu_synchronize").commit is not None
    assert len(r.unit("mini_gpu_synchronize").evidence) == 4  # static, build, parity, perf
    assert state(r, "mini_gpu_tensor_bytes") == (
        "built", state(r, "mini_gpu_tensor_bytes")[1]) and "no parity evidence" in state(r, "mini_gpu_tensor_bytes")[1]
    s, why = state(r, "mini_gpu_swiglu_tensor")
    assert s == "failing" and why.startswith("2 attempts; last attempt 2: static: stub body")
    s, why = state(r, "mini_gpu_add_tensor")
    assert s == "exhausted" and "1 attempts used up" in why
    s, why = state(r, "mini_gpu_tensor_free")
    assert s == "unported" and "hand-written: unverified" in why
    assert state(r, "mini_gpu_init") == ("unported", "no unit file, no attempt")
    assert r.counts == {"verified": 1, "verified (perf unmeasured)": 0, "verified (unsandboxed)": 0, "built": 1, "stale": 0, "tampered": 0, "failing": 1, "exhausted": 1,
                        "unported": 20, "total": 24}
    assert r.exit_code == 0


def test_attempts_after_exhaustion_are_failing_again(ws):
    ws.fail("mini_gpu_add_tensor", 1)
    ws.exhaust("mini_gpu_add_tensor", 1)
    ws.fail("mini_gpu_add_tensor", 2)
    assert state(derive(ws.root, TARGET), "mini_gpu_add_tensor")[0] == "failing"


def test_attempt_without_gate_result(ws):
    ws.attempt("mini_gpu_add_tensor", 1, "x")
    s, why = state(derive(ws.root, TARGET), "mini_gpu_add_tensor")
    assert s == "failing" and "run in progress or interrupted" in why


def test_verified_then_rebuilt_counts_latest_step(ws):
    ws.port("mini_gpu_swiglu_tensor", 1)
    ws.port("mini_gpu_swiglu_tensor", 2, state="built", source=SOURCES["mini_gpu_swiglu_tensor"] + "// v2\n")
    assert state(derive(ws.root, TARGET), "mini_gpu_swiglu_tensor")[0] == "built"


def test_uncommitted_step_is_not_tampering(ws):
    ws.port("mini_gpu_swiglu_tensor", commit=False)
    s, why = state(derive(ws.root, TARGET), "mini_gpu_swiglu_tensor")
    assert s == "verified" and "not committed yet" in why


def test_reconciled_step_without_commit(ws):
    step, _ = ws.port("mini_gpu_swiglu_tensor", commit=False)
    ws.ledger.append("reconcile", target=TARGET, unit="mini_gpu_swiglu_tensor", step=step["hash"],
                     action="abandoned: commit failed")
    ws.write_unit("mini_gpu_swiglu_tensor", "// porter:placeholder\n")
    ws.commit_all("commit the ledger with the reconciled step")
    s, _ = state(derive(ws.root, TARGET), "mini_gpu_swiglu_tensor")
    assert s == "failing"


def test_stub_with_forged_step_caught_by_the_static_gate(ws, monkeypatch):
    """A hand-stubbed file whose sha256 a forged step claims: the static scan still says no."""
    ws.port("mini_gpu_swiglu_tensor", source=STUB["mini_gpu_swiglu_tensor"])

    def fake_static(candidate, ctx):
        stub = "return -1;" in candidate.source and "<<<" not in candidate.source
        return GateResult("static", not stub, "stub body: it only returns -1" if stub else "ok")

    monkeypatch.setattr(status_mod, "static", types.SimpleNamespace(run=fake_static))
    s, why = state(derive(ws.root, TARGET), "mini_gpu_swiglu_tensor")
    assert s == "stale" and "static gate now rejects" in why and "stub" in why


def test_real_static_gate_when_installed(ws):
    pytest.importorskip("porter.gates.static")
    ws.port("mini_gpu_swiglu_tensor")
    ws.port("mini_gpu_add_tensor")
    r = derive(ws.root, TARGET)
    assert state(r, "mini_gpu_swiglu_tensor")[0] == "verified"
    ws.write_unit("mini_gpu_swiglu_tensor", STUB["mini_gpu_swiglu_tensor"])
    s, why = state(derive(ws.root, TARGET), "mini_gpu_swiglu_tensor")
    assert s == "stale" and "static gate" in why


def test_placeholder_claimed_verified_is_tampered(ws):
    ws.port("mini_gpu_swiglu_tensor", source="// porter:placeholder\nint x;\n")
    s, why = state(derive(ws.root, TARGET, use_static=False), "mini_gpu_swiglu_tensor")
    assert s == "tampered" and "placeholder" in why


def test_verified_step_without_parity_evidence_is_tampered(ws):
    cand = ws.write_unit("mini_gpu_add_tensor", SOURCES["mini_gpu_add_tensor"])
    ws.attempt("mini_gpu_add_tensor", 1, SOURCES["mini_gpu_add_tensor"])
    _, build_ev = ws.gate("mini_gpu_add_tensor", 1, "build", True, cand)
    step = ws.ledger.append("step", target=TARGET, unit="mini_gpu_add_tensor", attempt=1, state="verified",
                            candidate_sha256=cand, unit_file=ws.rel(ws.unit_path("mini_gpu_add_tensor")),
                            evidence=[build_ev])
    ws.commit_step(step)
    r = derive(ws.root, TARGET)
    s, why = state(r, "mini_gpu_add_tensor")
    assert s == "tampered" and "no" in why and "passing parity" in why
    assert r.exit_code == 3


def test_json_schema_and_exit_code(ws, capsys):
    ws.port("mini_gpu_synchronize")
    code, out = run_status(ws, capsys=capsys)
    data = json.loads(out)
    assert code == 0
    assert list(data)[:5] == ["target", "units", "counts", "critical_path", "ledger"]
    assert data["target"] == TARGET and len(data["units"]) == 24
    u = next(x for x in data["units"] if x["unit"] == "mini_gpu_synchronize")
    assert set(u) >= {"unit", "state", "reason", "attempts", "candidate_sha256", "evidence", "commit"}
    assert u["state"] == "verified" and u["attempts"] == 1 and len(u["commit"]) == 40
    assert set(data["counts"]) == set(STATES) | {"total"}
    assert set(data["ledger"]) >= {"records", "ok", "keyed", "problems"}
    assert data["ledger"]["ok"] is True and data["ledger"]["keyed"] is False


def test_text_rendering(ws, capsys):
    ws.port("mini_gpu_synchronize")
    code, out = run_status(ws, json_out=False, capsys=capsys)
    assert code == 0
    assert "mini_gpu_synchronize" in out and "verified" in out
    assert "units (24): 1 verified, 23 unported" in out
    assert "ledger: 6 records, chain ok, UNKEYED" in out
    assert "critical path" in out


def test_keyed_ledger_line(ws, monkeypatch, capsys):
    monkeypatch.setenv("PORTER_LEDGER_KEY", "k")
    ws.ledger.key = b"k"
    ws.port("mini_gpu_synchronize")
    code, out = run_status(ws, json_out=False, capsys=capsys)
    assert code == 0 and "chain ok, HMAC-keyed" in out


def test_critical_path_counted_apart(ws, monkeypatch):
    ranked = []
    for i, unit in enumerate(ws.target.units):
        tier = "runtime" if unit in ws.target.runtime_units else ("prefill" if "swiglu" in unit or "add" in unit else "decode")
        ranked.append(types.SimpleNamespace(unit=unit, tier=tier, rank=i, reasons=[], kernels=[], quant_types=[]))
    monkeypatch.setattr(status_mod, "ranked_units", lambda target: ranked)
    ws.port("mini_gpu_swiglu_tensor")
    r = derive(ws.root, TARGET)
    cp = r.critical_path
    assert cp["available"] and cp["counts"]["total"] == 12 and cp["counts"]["verified"] == 1
    assert r.unit("mini_gpu_swiglu_tensor").tier == "prefill"
    buf = io.StringIO()
    render(r, Console(file=buf, width=200))
    assert "critical path (runtime+prefill, 12 units): 1 verified, 11 unported" in buf.getvalue()


def test_ranking_unavailable_is_said(ws, monkeypatch):
    def broken(target):
        raise FileNotFoundError("mini_metal.m")

    monkeypatch.setattr(status_mod, "ranked_units", broken)
    r = derive(ws.root, TARGET)
    assert not r.critical_path["available"] and "ranking unavailable" in r.critical_path["reason"]


def test_target_defaults_to_the_only_one(ws):
    assert derive(ws.root, None).target == TARGET


def test_unknown_target(ws):
    with pytest.raises(PorterError):
        derive(ws.root, "nope")


def test_reverify_reports_a_fresh_verdict_per_unit(ws, capsys):
    code, out = run_status(ws, json_out=True, capsys=capsys)
    args = argparse.Namespace(workspace=ws.root, target=TARGET, json=True, reverify=True, source=None)
    assert status_mod.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    fresh = data["reverify"]["units"]
    assert len(fresh) == len(data["units"]) and data["reverify"]["contradicted"] == []
    # every file of this workspace is a placeholder: nothing is claimed, nothing to check
    assert all(u["ok"] is None and u["verdicts"] == [] for u in fresh)


def test_not_a_git_repository(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    ws.port("mini_gpu_synchronize", commit=False)
    import shutil

    shutil.rmtree(ws.root / ".git")
    r = derive(ws.root, TARGET)
    assert any("not a git repository" in n for n in r.notes)
    s, why = state(r, "mini_gpu_synchronize")
    assert s == "verified" and "not committed" in why


def test_add_arguments():
    p = argparse.ArgumentParser()
    status_mod.add_arguments(p)
    a = p.parse_args(["--json", "--reverify"])
    assert a.json and a.reverify


def test_reasons_are_not_rich_markup(ws, capsys):
    ws.fail("mini_gpu_add_tensor", 1, gate="parity", summary="parity not run: pip install 'porter[gpu]'")
    code, out = run_status(ws, json_out=False, capsys=capsys)
    assert "porter[gpu]" in out


def test_benchmark_runs_small(capsys):
    """The benchmark itself (timed at 10,000 records by hand, not here) works end to end."""
    from porter.bench import status as bench_status

    assert bench_status.main(["--records", "300", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("status over ") and "target < 0.5 s" in out and "signed (Ed25519 SHA256:" in out


def test_a_verified_unit_says_which_gpu_kind_and_host_its_parity_ran_on(ws):
    """Issue 32: a verdict holds for the GPU kind it ran on (a unit verified on sm_90 can fail on sm_121):
    status names the architecture, GPU and host its parity evidence records."""
    ws.port("mini_gpu_synchronize", toolchain={"nvcc": "release 13.0", "arch": "sm_121", "gpu": "NVIDIA GB10",
                                               "host": "spark-2", "executor": "ray"})
    ws.port("mini_gpu_tensor_bytes")  # host stand-in evidence: no architecture to name
    r = derive(ws.root, TARGET)
    s, why = state(r, "mini_gpu_synchronize")
    assert s == "verified" and why.endswith("; parity ran on sm_121 (NVIDIA GB10, host spark-2)")
    assert "parity ran on" not in state(r, "mini_gpu_tensor_bytes")[1]


def test_a_unit_verified_outside_the_sandbox_is_never_plain_verified(ws):
    """--unsafe-no-sandbox: the candidate could have written anything, so its parity evidence says
    "sandbox": "none" and status says so (with perf evidence too, it is not 'verified')."""
    ws.port("mini_gpu_synchronize", sandbox="none")
    ws.port("mini_gpu_tensor_bytes")
    r = derive(ws.root, TARGET)
    s, why = state(r, "mini_gpu_synchronize")
    assert s == "verified (unsandboxed)" and "outside the sandbox" in why
    assert state(r, "mini_gpu_tensor_bytes")[0] == "verified"


def test_speed_per_unit_and_for_the_target(ws, capsys):
    """Status shows each verified unit's time on its timed case, x the known-good, % of the roofline and the
    regime, in the table and in --json, and a target line: geomean x known-good, units below half their
    roofline share (the known-good's own share, or the declared floor)."""
    ws.port("mini_gpu_swiglu_tensor", timing={"case": "n=2^20", "median_ms": 0.5, "roofline_ms": 0.1},
            perf_facts={"ratio": 3.0, "decided_by": "known-good", "baseline": {"median_ms": 0.1667}})
    ws.port("mini_gpu_add_tensor", timing={"case": "n=2^20", "median_ms": 0.2, "roofline_ms": 0.1},
            perf_facts={"ratio": 1.2, "decided_by": "known-good", "baseline": {"median_ms": 0.1667}})
    ws.port("mini_gpu_synchronize")  # verified, nothing timed
    code, out = run_status(ws, capsys=capsys)
    data = json.loads(out)
    units = {u["unit"]: u for u in data["units"]}
    slow = units["mini_gpu_swiglu_tensor"]["speed"]
    assert slow["time_ms"] == 0.5 and slow["x_known_good"] == 3.0 and slow["pct_roofline"] == pytest.approx(20.0)
    assert slow["regime"] == "device" and slow["below_half"] is True  # 20% where the known-good reaches 60%
    assert units["mini_gpu_add_tensor"]["speed"]["below_half"] is False
    assert units["mini_gpu_synchronize"]["speed"] is None
    summ = data["speed"]
    assert summ["geomean_x_known_good"] == pytest.approx((3.0 * 1.2) ** 0.5) and summ["units_compared"] == 2
    assert summ["below_half_roofline_share"] == 1 and summ["regimes"] == ["device"]
    buf = io.StringIO()
    render(derive(ws.root, TARGET), Console(file=buf, width=240))
    text = buf.getvalue()
    assert "0.5 ms 3x 20% device" in text
    assert "speed (device regime): 2 unit(s) timed, geomean 1.90x the known-good over 2 unit(s); " \
           "1 below half their roofline share" in text


# ---- required architectures (issue 32) ----

def _on(*verdicts: tuple[str, bool | None]) -> dict:
    """Parity evidence facts of a run across required architectures (porter.gates.archs.across): each
    (arch, True | False | None: not measured)."""
    return {"archs": {a: ({"measured": True, "ok": ok, "summary": "", "evidence": {"toolchain": {"arch": a}}}
                          if ok is not None else {"measured": False, "why": f"no GPU of {a} reachable"})
                      for a, ok in verdicts}}


def _require(ws, archs: str) -> None:
    toml = ws.root / "targets" / TARGET / "target.toml"
    toml.write_text(toml.read_text().replace("default_arch = ", f"required_archs = {archs}\ndefault_arch = "))


def test_a_unit_verified_on_sm_90_only_is_not_verified_while_sm_121_is_required(ws, capsys):
    """Nothing is reported that was not measured: parity passed on sm_90 and no GPU of sm_121 was reachable,
    so the unit is built, shown 'built (sm_121 not measured)' in the table and in --json."""
    ws.port("mini_gpu_synchronize", toolchain={"nvcc": "13.0", "arch": "sm_90", "gpu": "NVIDIA H100"})
    ws.port("mini_gpu_tensor_bytes", toolchain={"nvcc": "13.0", "arch": "sm_90"},
            parity_facts=_on(("sm_90", True), ("sm_121", None)))
    ws.port("mini_gpu_add_tensor", toolchain={"nvcc": "13.0", "arch": "sm_90"},
            parity_facts=_on(("sm_90", True), ("sm_121", True)))
    r = derive(ws.root, TARGET)
    assert state(r, "mini_gpu_synchronize")[0] == "verified"  # nothing required: the kind it ran on, named
    assert r.unit("mini_gpu_synchronize").archs == {"sm_90": "verified"}
    _require(ws, '["sm_90", "sm_121"]')
    r = derive(ws.root, TARGET)
    for unit in ("mini_gpu_synchronize", "mini_gpu_tensor_bytes"):
        u = r.unit(unit)
        assert u.state == "built" and u.label == "built (sm_121 not measured)", (unit, u.state, u.label)
        assert u.archs == {"sm_90": "verified", "sm_121": "not measured"}
        assert "sm_121 not measured (required" in u.reason and "not verified" in u.reason
    both = r.unit("mini_gpu_add_tensor")
    assert both.state == "verified" and both.archs == {"sm_90": "verified", "sm_121": "verified"}
    assert "parity passed on sm_90, sm_121" in both.reason
    code, out = run_status(ws, capsys=capsys)
    j = {u["unit"]: u for u in json.loads(out)["units"]}
    assert j["mini_gpu_tensor_bytes"]["label"] == "built (sm_121 not measured)"
    assert j["mini_gpu_tensor_bytes"]["archs"]["sm_121"] == "not measured"
    code, out = run_status(ws, json_out=False, capsys=capsys, wide=True)
    assert "built (sm_121 not measured)" in out


def test_a_unit_refused_on_sm_121_shows_failing_sm_121(ws, monkeypatch, capsys):
    monkeypatch.setenv("PORTER_REQUIRE_ARCH", "sm_90,sm_121")  # --require-arch, as the CLI passes it on
    ws.fail("mini_gpu_swiglu_tensor", 1, gate="parity", summary="[sm_121] parity failed [values]: case 3",
            facts=_on(("sm_90", True), ("sm_121", False)))
    r = derive(ws.root, TARGET)
    u = r.unit("mini_gpu_swiglu_tensor")
    assert u.state == "failing" and u.label == "failing (sm_121)" and u.archs == {"sm_90": "verified",
                                                                                   "sm_121": "failing"}
    code, out = run_status(ws, json_out=False, capsys=capsys, wide=True)
    assert "failing (sm_121)" in out
