"""Units committed as 'built' (no GPU at the time) are verified once parity can run.

CI has no GPU, so the parity gate is replaced by a stand-in that refuses the
candidates the scripted manifest says only parity can catch and passes the
rest.  What is under test is the loop: a built unit is checked before any new
answer is asked for; a pass lands a 'verified' step on the same file; a
refusal is a failure of the committed attempt, and the next answer follows.
"""

from __future__ import annotations

import tomllib

import pytest

from conftest import gates_with, needs_nvcc
from porter.cli import main
from porter.gates.extract import extract_unit_source
from porter.gates.result import GateResult
from porter.records.ledger import Ledger
from porter.digest import sha256_bytes
from porter.target import load_target

ATTN = "mini_gpu_attention_window_tensor"  # scripted: no-sink answer (parity must refuse), then the good one
ADD = "mini_gpu_add_tensor"  # scripted: only a good answer


def _parity_bad_shas(target) -> set[str]:
    manifest = tomllib.loads((target.scripted_dir / "manifest.toml").read_text())["answer"]
    out = set()
    for a in manifest:
        if a["expect"] == "parity":
            code = extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)
            out.add(sha256_bytes(code.encode()))
    return out


class StandInParity:
    """Refuses exactly the candidates the manifest marks as parity failures."""

    def __init__(self, bad: set[str]):
        self.bad = bad
        self.calls: list[tuple[str, str]] = []

    def run(self, candidate, ctx):
        from porter.spec import load_spec

        unit, candidate_sha256 = candidate.unit, candidate.sha256
        if load_spec(ctx.target, unit) is None:  # as the real gate: runtime units have no spec
            return GateResult("parity", False, "parity skipped: no spec (stand-in)", skipped=True)
        self.calls.append((unit, candidate_sha256))
        ok = candidate_sha256 not in self.bad
        return GateResult("parity", ok, "parity ok (stand-in)" if ok else "parity failed [values] (stand-in)",
                          evidence={"candidate_sha256": candidate_sha256, "stand_in": True})


def use_parity(monkeypatch, stand_in: StandInParity | None) -> None:
    """The parity gate the driver runs: none (no GPU here), or the stand-in."""
    import porter.gates.parity as parity
    from porter.gates import registry

    monkeypatch.setattr(parity, "available", lambda: (False, "no GPU in this test") if stand_in is None
                        else (True, "stand-in"))
    monkeypatch.setattr(registry, "ACTIVE", gates_with(parity=stand_in or parity))


def _run(ws, *args) -> int:
    return main(["-C", str(ws), "run", "--target", "minimoe", "--provider", "scripted", *args])


@needs_nvcc
def test_built_units_are_verified_or_reported_once_parity_can_run(workspace, build_cache, monkeypatch):
    target = load_target(workspace, "minimoe")
    use_parity(monkeypatch, None)
    assert _run(workspace, "--unit", ATTN, "--unit", ADD, "--max-attempts", "3") == 0
    built = Ledger(workspace).records()
    assert [r["state"] for r in built if r["kind"] == "step"] == ["built", "built"]
    no_sink_sha = next(r["candidate_sha256"] for r in built if r["kind"] == "step" and r["unit"] == ATTN)
    assert no_sink_sha in _parity_bad_shas(target)  # the no-sink answer was committed: CI could not tell

    stand_in = StandInParity(_parity_bad_shas(target))
    use_parity(monkeypatch, stand_in)
    add_file = target.unit_path(ADD).read_bytes()
    assert _run(workspace, "--unit", ATTN, "--unit", ADD, "--max-attempts", "3") == 0

    records = Ledger(workspace).records()
    new = records[len(built):]
    # the committed no-sink candidate was checked first, refused, and recorded as a failure of attempt 1
    fail = [r for r in new if r["kind"] == "failure" and r["unit"] == ATTN]
    assert [(f["attempt"], f["gate"]) for f in fail] == [(1, "parity")]
    assert stand_in.calls[0] == (ATTN, no_sink_sha)
    # then the next scripted answer (the good one) was asked for and verified
    steps = [r for r in new if r["kind"] == "step"]
    assert [(s["unit"], s["attempt"], s["state"]) for s in steps] == [(ATTN, 2, "verified"), (ADD, 1, "verified")]
    assert steps[0]["candidate_sha256"] != no_sink_sha
    # the add unit was verified on its committed file, untouched
    assert target.unit_path(ADD).read_bytes() == add_file
    assert steps[1]["candidate_sha256"] == sha256_bytes(add_file)

    # and a third run has nothing left to do for either unit
    n = len(records)
    assert _run(workspace, "--unit", ATTN, "--unit", ADD, "--max-attempts", "3") == 0
    assert not [r for r in Ledger(workspace).records()[n:] if r.get("unit") in (ATTN, ADD) and r["kind"] != "usage"]


@needs_nvcc
def test_a_refuted_built_unit_is_not_rechecked_every_run(workspace, build_cache, monkeypatch):
    import porter.run as run_package

    target = load_target(workspace, "minimoe")
    use_parity(monkeypatch, None)
    assert _run(workspace, "--unit", ATTN, "--max-attempts", "1") == 0
    stand_in = StandInParity(_parity_bad_shas(target))
    use_parity(monkeypatch, stand_in)
    # one attempt allowed: the committed candidate is refuted, the good answer is then refused too
    stand_in.bad.add(sha256_bytes(extract_unit_source(
        (target.scripted_dir / f"good/{ATTN}.md").read_text(), ATTN, target).encode()))
    assert _run(workspace, "--unit", ATTN, "--max-attempts", "1") == 1
    checked = [c for c in stand_in.calls if c[0] == ATTN]
    assert len(checked) == 2  # the committed file once, the new answer once
    from porter.commands.status import derive

    st = {u.unit: u for u in derive(workspace, target=target).units}[ATTN]
    assert st.state == "exhausted" and "built file (attempt 1) failed parity" in st.reason
    stand_in.calls.clear()
    # without --unit the exhausted unit is left alone: the refuted file is not re-checked
    monkeypatch.setattr(run_package, "ordered_units", lambda target, out: [ATTN, ADD])
    assert _run(workspace, "--max-attempts", "1") == 0
    assert [c[0] for c in stand_in.calls] == [ADD]


class StandInScenarioParity:
    """The real gate's rule for runtime scenarios (skipped while a unit the scenario calls is a
    placeholder), and a pass otherwise."""

    def __init__(self):
        self.calls: list[str] = []

    def run(self, candidate, ctx):
        from porter.gates.parity.scenario import blocked_by
        from porter.spec import load_spec

        waiting = blocked_by(ctx.target, load_spec(ctx.target, candidate.unit))
        if waiting:
            return GateResult("parity", False, f"parity skipped: also calls unported {', '.join(waiting)}",
                              skipped=True)
        self.calls.append(candidate.unit)
        return GateResult("parity", True, "parity ok (stand-in)", evidence={
            "candidate_sha256": candidate.sha256, "stand_in": True})


RUNTIME = ["mini_gpu_init", "mini_gpu_cleanup", "mini_gpu_tensor_alloc", "mini_gpu_tensor_view", "mini_gpu_tensor_free",
           "mini_gpu_tensor_bytes", "mini_gpu_tensor_write", "mini_gpu_tensor_read", "mini_gpu_tensor_copy",
           "mini_gpu_synchronize"]


@needs_nvcc
@pytest.mark.parametrize("jobs", ["1", "4"])
def test_runtime_units_whose_scenarios_call_each_other_are_verified_in_the_same_run(workspace, build_cache,
                                                                                   monkeypatch, jobs):
    """Measured on ds4 with --jobs 8: 20 of 24 runtime units ended 'built' because each one's scenario
    was skipped while the others were placeholders.  Once the pass is over, the run verifies them."""
    stand_in = StandInScenarioParity()
    use_parity(monkeypatch, stand_in)
    args = [a for u in RUNTIME for a in ("--unit", u)]
    assert _run(workspace, *args, "--max-attempts", "2", "--jobs", jobs) == 0
    steps = [r for r in Ledger(workspace).records() if r["kind"] == "step"]
    last = {s["unit"]: s["state"] for s in steps}
    assert last == {u: "verified" for u in RUNTIME}
    deferred = [s["unit"] for s in steps if s["state"] == "built"]
    assert deferred  # the first units could not be checked when they landed ...
    assert sorted(stand_in.calls) == sorted(RUNTIME)  # ... and each was checked once, when it could be
    # the deferred ones were verified on their committed files: same candidate, no new answer
    for u in deferred:
        mine = [s for s in steps if s["unit"] == u]
        assert [s["state"] for s in mine] == ["built", "verified"]
        assert mine[0]["candidate_sha256"] == mine[1]["candidate_sha256"]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))


def test_parity_waits_for_the_api_functions_a_candidate_calls(workspace):
    """ds4's shared gate/up slice calls ds4_gpu_swiglu_tensor: refused 3 times on an H100 while swiglu was
    a placeholder.  Parity skips such a candidate (it lands 'built', verified once the callee is ported)."""
    from porter.target.cparse import calls_to
    from porter.gates import parity
    from porter.gates.driver import Candidate, GateContext, ParityOptions

    target = load_target(workspace, "minimoe")
    src = ('// mini_gpu_add_tensor(x) in a comment is no call\n'
           'extern "C" int mini_gpu_rms_norm_plain_rows_tensor(void *a) {\n'
           '  const char *s = "mini_gpu_add_tensor(";\n'
           '  return mini_gpu_swiglu_tensor(a, a, a, 4) && s; }\n')
    assert calls_to(src, set(target.units)) == {"mini_gpu_swiglu_tensor"}
    ctx = GateContext(target, workspace, library=workspace / "lib.so", parity=ParityOptions(mode="host"))
    ctx.results["build"] = GateResult("build", True, "built")
    res = parity.run(Candidate.of("mini_gpu_rms_norm_plain_rows_tensor", src), ctx)
    assert res.skipped and not res.ok
    assert res.summary == ("parity skipped: mini_gpu_rms_norm_plain_rows_tensor calls unported "
                           "mini_gpu_swiglu_tensor")
    # once the callee is ported, nothing holds the candidate back
    good = (target.scripted_dir / "good" / "mini_gpu_swiglu_tensor.md").read_text()
    target.unit_path("mini_gpu_swiglu_tensor").write_text(extract_unit_source(good, "mini_gpu_swiglu_tensor", target))
    assert parity.waiting_on(target, None, Candidate.of("mini_gpu_rms_norm_plain_rows_tensor", src)) is None


def test_parity_waits_for_a_callee_the_library_linked_as_placeholder(workspace):
    """--jobs N: a unit's library is linked, then a callee is committed, then parity checks.  ds4's
    tensor_copy was linked while tensor_alloc was a placeholder and refused for alloc's NULL once alloc
    had landed: the library's own record, not the workspace as it is now, says what was linked."""
    from porter.gates import parity
    from porter.gates.driver import Candidate, GateContext, ParityOptions

    target = load_target(workspace, "minimoe")
    src = 'extern "C" int mini_gpu_rms_norm_plain_rows_tensor(void *a) { return mini_gpu_swiglu_tensor(a, a, a, 4); }\n'
    good = (target.scripted_dir / "good" / "mini_gpu_swiglu_tensor.md").read_text()
    target.unit_path("mini_gpu_swiglu_tensor").write_text(extract_unit_source(good, "mini_gpu_swiglu_tensor", target))
    cand = Candidate.of("mini_gpu_rms_norm_plain_rows_tensor", src)
    assert parity.waiting_on(target, None, cand) is None  # the workspace has it now
    linked_then = {"mini_gpu_swiglu_tensor": {"role": "called", "placeholder": True}}
    assert parity.waiting_on(target, None, cand, linked_then) == (
        "mini_gpu_rms_norm_plain_rows_tensor calls unported mini_gpu_swiglu_tensor")
    ctx = GateContext(target, workspace, library=workspace / "lib.so", parity=ParityOptions(mode="host"))
    ctx.results["build"] = GateResult("build", True, "built", evidence={"linked": linked_then})
    res = parity.run(cand, ctx)
    assert res.skipped and "calls unported mini_gpu_swiglu_tensor" in res.summary
    # linked ported: nothing holds it back
    assert parity.waiting_on(target, None, cand, {"mini_gpu_swiglu_tensor": {"placeholder": False}}) is None
