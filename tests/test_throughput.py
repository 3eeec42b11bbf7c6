"""The throughput gate (porter.gates.e2e.throughput*): upstream's engine against the port's, ABBA, judged by
porter on samples it validates (CPU only).

The arithmetic is tested on samples of known shape: equal engines pass, a slower one is refused with its
ratio and p-value, noise alone never refuses, and a report the candidate's process forged (phases that do
not fit the wall time porter measured, work moved out of its timing windows, wrong token counts) is
refused, never accepted.  The gate runs with a stand-in driver whose engines are such samples; ds4's
CSV reader is tested on what ds4-bench writes and on what a hostile process could write instead.
"""

from __future__ import annotations

import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from porter.errors import PorterError
from porter.gates.e2e import throughput as tp
from porter.gates.e2e import throughput_gate, tree
from porter.gates.e2e.compare import ReferenceFailure
from porter.gates.e2e.throughput_state import throughput_due, throughput_lines, throughput_state
from porter.gates.evidence import ThroughputEvidence
from porter.target import ThroughputSpec, load_target
from porter.target.code import load_file

ROOT = Path(__file__).resolve().parents[1]
PRE, DEC = 2048, 128


def sample(backend, prefill_s, decode_s, load_s=5.0, **over) -> tp.Sample:
    s = tp.Sample(backend, load_s + prefill_s + decode_s, PRE, prefill_s, DEC, decode_s)
    for k, v in over.items():
        setattr(s, k, v)
    return s


def abba(up_pre, cand_pre, up_dec=2.0, cand_dec=2.0, rounds=3, noise=0.01, seed=0, cand_load=5.0) -> list:
    """ABBA samples whose times are the given ones times (1 + noise * N(0,1))."""
    rng = np.random.default_rng(seed)
    jitter = lambda: 1 + noise * rng.standard_normal()  # noqa: E731
    out = []
    for backend in tp.abba_order(rounds):
        if backend == tp.UPSTREAM:
            out.append(sample(backend, up_pre * jitter(), up_dec * jitter(), 5.0 * jitter()))
        else:
            out.append(sample(backend, cand_pre * jitter(), cand_dec * jitter(), cand_load * jitter()))
    return out


# -- the arithmetic ------------------------------------------------------------------------------------

def test_abba_order_alternates_and_needs_a_round():
    assert tp.abba_order(2) == ["upstream", "candidate", "candidate", "upstream"] * 2
    with pytest.raises(ValueError):
        tp.abba_order(0)


def test_the_exact_permutation_test_reaches_its_smallest_p_on_separated_samples_only():
    up = np.array([1.0, 1.01, 0.99, 1.0, 1.02, 0.98])
    assert tp.permutation_p(up, up * 1.5) == pytest.approx(1 / 924)  # C(12, 6) splits, the observed one alone
    assert tp.permutation_p(up, up.copy()) > 0.3
    assert tp.permutation_p(up * 1.5, up) == 1.0  # one-sided: a faster candidate is never "slower"


def test_equal_engines_are_fast_and_the_verdict_names_its_figures():
    v = tp.decide(abba(1.0, 1.0), PRE, DEC)
    assert v.ok and [p.phase for p in v.phases] == ["prefill", "decode"]
    pre = v.phases[0]
    assert pre.ratio == pytest.approx(1.0, abs=0.05) and pre.upstream_tps == pytest.approx(2048, rel=0.05)
    assert "prefill" in v.reason and "t/s" in v.reason and "A/A margin" in v.reason


def test_a_slower_prefill_is_refused_with_its_ratio_and_a_small_p_while_decode_stays_fast():
    v = tp.decide(abba(1.0, 1.3), PRE, DEC)
    assert not v.ok
    pre, dec = v.phases
    assert not pre.ok and pre.ratio == pytest.approx(1 / 1.3, rel=0.05) and pre.p_value < 0.01
    assert dec.ok and "slower than upstream beyond its own run-to-run margin" in pre.reason


def test_a_slower_decode_is_refused_too():
    v = tp.decide(abba(1.0, 1.0, up_dec=2.0, cand_dec=3.0), PRE, DEC)
    assert not v.ok and v.phases[0].ok and not v.phases[1].ok


def test_a_difference_inside_upstreams_own_spread_is_not_refused():
    # upstream's runs spread by ~20%: a 5% slower candidate is within that margin
    samples = abba(1.0, 1.05, noise=0.08, seed=3)
    v = tp.decide(samples, PRE, DEC)
    assert v.phases[0].margin > 0.05 and v.phases[0].ok


def test_the_test_can_fail_each_way_on_the_same_size_of_slowdown():
    """The rule is not a constant: the same 30% slowdown is refused under 1% noise and kept, as not
    shown, when upstream's own runs spread by more than it."""
    assert not tp.decide(abba(1.0, 1.3, noise=0.01), PRE, DEC).phases[0].ok
    noisy = tp.decide(abba(1.0, 1.3, noise=0.15, seed=1), PRE, DEC).phases[0]
    assert noisy.ok and noisy.margin > 0.3


def test_a_forged_report_that_moves_work_out_of_its_windows_is_refused_as_inconsistent():
    """The candidate's process halves the prefill time it reports; the work still took its time, which
    now lies outside the windows: porter's wall clock sees it."""
    honest_slow = abba(1.0, 4.0)
    forged = [s if s.backend == tp.UPSTREAM else
              sample(s.backend, s.prefill_s / 4, s.decode_s, load_s=s.wall_s - s.prefill_s / 4 - s.decode_s)
              for s in honest_slow]
    assert all(f.wall_s == pytest.approx(h.wall_s) for f, h in zip(forged, honest_slow))
    v = tp.decide(forged, PRE, DEC)
    assert not v.ok and "do not account for the wall time porter measured" in v.reason
    assert v.consistency["resolution_s"] >= 0
    # the same reports with honest walls are simply judged slow
    assert not tp.decide(honest_slow, PRE, DEC).phases[0].ok


@pytest.mark.parametrize("change, words", [
    ({"prefill_s": float("nan")}, "not positive finite"),
    ({"decode_s": -1.0}, "not positive finite"),
    ({"prefill_s": 50.0}, "inside a process porter timed"),
    ({"prefill_tokens": 512}, "not the 2048 and 128"),
    ({"decode_tokens": 1}, "not the 2048 and 128"),
])
def test_a_candidate_report_that_cannot_be_true_is_refused(change, words):
    samples = abba(1.0, 1.0)
    bad = next(i for i, s in enumerate(samples) if s.backend == tp.CANDIDATE)
    for k, v in change.items():
        setattr(samples[bad], k, v)
    v = tp.decide(samples, PRE, DEC)
    assert not v.ok and not v.skipped and words in v.reason


def test_an_upstream_report_that_cannot_be_true_skips_rather_than_judges():
    samples = abba(1.0, 1.0)
    samples[0].prefill_tokens = 7
    v = tp.decide(samples, PRE, DEC)
    assert v.skipped and not v.ok and "upstream" in v.reason


def test_too_few_runs_of_a_side_is_no_verdict():
    v = tp.decide([s for s in abba(1.0, 1.0, rounds=1) if s.backend == tp.UPSTREAM], PRE, DEC)
    assert not v.ok and "too few runs" in v.reason


# -- ds4's benchmark report ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ds4_driver():
    return load_file(ROOT / "targets" / "ds4" / "e2e" / "driver.py")


GOOD_CSV = (b"ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes\n"
            b"2048,2048,4096.00,128,64.00,123456\n")


def test_ds4_bench_csv_becomes_a_sample_in_seconds(ds4_driver):
    s = ds4_driver.parse_bench_csv(GOOD_CSV, tp.CANDIDATE, 9.0)
    assert (s.prefill_tokens, s.decode_tokens, s.wall_s) == (2048, 128, 9.0)
    assert s.prefill_s == pytest.approx(0.5) and s.decode_s == pytest.approx(2.0)


@pytest.mark.parametrize("raw, words", [
    (GOOD_CSV + b"4096,2048,4000.00,128,60.00,1\n", "one row"),
    (GOOD_CSV.replace(b"prefill_tps", b"prefill_rate"), "one row"),
    (GOOD_CSV.replace(b"4096.00", b"fast"), "six numbers"),
    (GOOD_CSV.replace(b"4096.00", b"0.00"), "one prefill from empty"),
    (GOOD_CSV.replace(b"2048,2048", b"4096,2048"), "one prefill from empty"),
    (b"\xff\xfe" + GOOD_CSV, "not ASCII"),
    (b"", "one row"),
])
def test_a_ds4_bench_csv_that_is_not_what_ds4_bench_writes_is_refused(ds4_driver, raw, words):
    with pytest.raises(PorterError, match=words):
        ds4_driver.parse_bench_csv(raw, tp.CANDIDATE, 9.0)


def test_ds4_bench_runs_one_frontier_with_the_asked_decode(ds4_driver, tmp_path):
    cmd = ds4_driver.bench_command(tmp_path, tmp_path / "m.gguf", tmp_path / "p.txt", tmp_path / "o.csv", 2048, 128)
    assert cmd[0].endswith("ds4-bench") and "--cuda" in cmd
    for flag, value in (("--ctx-start", "2048"), ("--ctx-max", "2048"), ("--gen-tokens", "128")):
        assert cmd[cmd.index(flag) + 1] == value
    make = ds4_driver.make_command(tmp_path, "cuda", program="ds4-bench")
    assert "ds4-bench" in make and "ds4" not in make


def test_the_ds4_target_declares_its_benchmark_at_the_working_batch():
    import tomllib

    spec = tomllib.loads((ROOT / "targets" / "ds4" / "target.toml").read_text())["e2e"]["throughput"]
    assert ThroughputSpec(**spec) == ThroughputSpec(prefill_tokens=2048, decode_tokens=128, rounds=3)


# -- the gate with a stand-in driver -------------------------------------------------------------------

class StandIn:
    """A driver's runner whose engines give the samples of `times` (backend -> list of (prefill, decode))."""

    def __init__(self, times, fail_on=None):
        self.times = {k: list(v) for k, v in times.items()}
        self.setup = {"engine": "stand-in"}
        self.fail_on = fail_on
        self.order = []

    def run(self, backend):
        self.order.append(backend)
        if backend == self.fail_on:
            raise PorterError(f"{backend} engine crashed")
        pre, dec = self.times[backend].pop(0)
        return sample(backend, pre, dec)


@pytest.fixture
def gate_env(tmp_path, monkeypatch):
    ws = tmp_path
    shutil.copytree(ROOT / "targets" / "minimoe", ws / "targets" / "minimoe", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run(["git", "add", "-A"], cwd=ws, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1"], cwd=ws, check=True)
    plain = load_target(ws, "minimoe")
    toml = ws / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text() + f"\n[e2e.throughput]\nprefill_tokens = {PRE}\ndecode_tokens = {DEC}\n")
    target = load_target(ws, "minimoe")
    assert target.spec.e2e.throughput == ThroughputSpec(prefill_tokens=PRE, decode_tokens=DEC, rounds=3)
    lib = ws / "libbackend.so"
    lib.write_bytes(b"\x7fELF stand-in")
    monkeypatch.setattr(throughput_gate.sandbox, "require", lambda: None)
    made = {}

    def use(runner=None, error=None):
        def throughput_runner(target, scratch, library, model, *, prefill_tokens, decode_tokens, log):
            made["asked"] = (Path(library), prefill_tokens, decode_tokens)
            if error is not None:
                raise error
            return runner
        monkeypatch.setattr(throughput_gate, "load_driver", lambda t: types.SimpleNamespace(
            throughput_runner=throughput_runner))

    return types.SimpleNamespace(ws=ws, target=target, plain=plain, lib=lib, use=use, made=made)


def test_the_gate_runs_abba_and_records_a_fast_verdict_bound_to_the_backend_tree(gate_env):
    runner = StandIn({tp.UPSTREAM: [(1.0, 2.0)] * 6, tp.CANDIDATE: [(1.0, 2.0)] * 6})
    gate_env.use(runner)
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s",
                                         log=lambda *_: None)
    assert res.ok and not res.skipped and runner.order == tp.abba_order(3)
    assert gate_env.made["asked"] == (gate_env.lib, PRE, DEC)
    ev = ThroughputEvidence.of(res.evidence)
    assert ev.gate == "throughput" and ev.unit == "e2e:prefill" and len(ev.samples) == 12
    assert ev.tree_hash == tree.tree_hash_worktree(gate_env.ws, tree.backend_dirs(gate_env.target))
    assert ev.phase("prefill").ok and ev.phase("decode").ratio == pytest.approx(1.0)
    assert "upstream t/s" in res.diagnostics


def test_the_gate_measures_accuracy_after_the_timed_runs_and_records_it_beside_the_verdict(gate_env, tmp_path):
    """A runner with logit_rows (ds4's) is asked for upstream's logits twice and the port's once, after the
    ABBA runs; the figures go into the record and the diagnostics, and do not make the verdict."""
    from test_accuracy import Engines

    (tmp_path / "dumps").mkdir()
    eng = Engines(tmp_path / "dumps", port=lambda r: np.full_like(r, np.nan))

    class Runner(StandIn):
        n_vocab = eng.n_vocab

        def logit_rows(self, backend):
            self.order.append(f"logits:{backend}")
            return eng.logit_rows(backend)

    runner = Runner({tp.UPSTREAM: [(1.0, 2.0)] * 6, tp.CANDIDATE: [(1.0, 2.0)] * 6})
    gate_env.use(runner)
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s",
                                         log=lambda *_: None)
    assert res.ok, "reported beside the speed verdict, never one"
    assert runner.order == tp.abba_order(3) + ["logits:upstream", "logits:upstream", "logits:candidate"]
    ev = ThroughputEvidence.of(res.evidence)
    assert ev.accuracy.positions == 2048 and ev.accuracy.same_top == 0.0 and ev.accuracy.upstream_aa.same_top > 0.99
    assert "accuracy: the port's logits are not finite on 2048 of 2048 positions" in res.diagnostics and list((tmp_path / "dumps").iterdir()) == []


def test_without_a_scratch_of_the_callers_porters_own_is_removed_with_the_gate(gate_env, monkeypatch):
    import tempfile

    own_tmp = gate_env.ws / "own-tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    seen = []
    gate_env.use(StandIn({tp.UPSTREAM: [(1.0, 2.0)] * 6, tp.CANDIDATE: [(1.0, 2.0)] * 6}))
    real_use = throughput_gate.load_driver(gate_env.target).throughput_runner

    def remember(target, scratch, *a, **k):
        seen.append(scratch)
        (scratch / "fixture.gguf").write_bytes(b"GBs")
        return real_use(target, scratch, *a, **k)

    monkeypatch.setattr(throughput_gate, "load_driver", lambda t: types.SimpleNamespace(throughput_runner=remember))
    assert throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, log=lambda *_: None).ok
    assert seen and seen[0].parent == own_tmp and list(own_tmp.iterdir()) == []


def test_the_gate_refuses_a_slow_backend(gate_env):
    gate_env.use(StandIn({tp.UPSTREAM: [(1.0, 2.0), (1.01, 2.0), (0.99, 2.0)] * 2,
                          tp.CANDIDATE: [(2.0, 2.0), (2.02, 2.0), (1.98, 2.0)] * 2}))
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s",
                                         log=lambda *_: None)
    assert not res.ok and not res.skipped and "prefill" in res.summary and "slower than upstream" in res.summary


def test_a_crashing_candidate_fails_and_a_crashing_upstream_skips(gate_env):
    gate_env.use(StandIn({tp.UPSTREAM: [(1.0, 2.0)] * 6, tp.CANDIDATE: []}, fail_on=tp.CANDIDATE))
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s")
    assert not res.ok and not res.skipped and "candidate engine crashed" in res.summary
    gate_env.use(StandIn({tp.UPSTREAM: [], tp.CANDIDATE: []}, fail_on=tp.UPSTREAM))
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s")
    assert res.skipped and "upstream" in res.summary


def test_a_build_failure_is_the_candidates_and_an_upstream_build_failure_skips(gate_env):
    gate_env.use(error=PorterError("nvcc: undefined symbol"))
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s")
    assert not res.ok and not res.skipped and "undefined symbol" in res.summary
    gate_env.use(error=ReferenceFailure("upstream does not build"))
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.lib, scratch=gate_env.ws / "s")
    assert res.skipped


def test_no_declared_benchmark_or_no_library_is_skipped_before_anything_runs(gate_env):
    res = throughput_gate.run_throughput(gate_env.plain, gate_env.ws, gate_env.lib)
    assert res.skipped and "declares no [e2e.throughput]" in res.summary
    res = throughput_gate.run_throughput(gate_env.target, gate_env.ws, gate_env.ws / "missing.so")
    assert res.skipped and "no backend library" in res.summary


# -- what status says, and when run owes a measurement -------------------------------------------------

def _ev(tree_hash, ok=True, ratio=1.0, commit="c0ffee" * 6):
    phases = [{"phase": ph, "ok": ok, "upstream_tps": 1000.0, "candidate_tps": 1000.0 * ratio, "ratio": ratio,
               "margin": 0.02, "p_value": 0.5 if ok else 0.001, "reason": "x"} for ph in tp.PHASES]
    return ThroughputEvidence.of({"gate": "throughput", "unit": "e2e:prefill", "target": "t", "ok": ok,
                                  "tree_hash": tree_hash, "commit": commit, "verdict": {"ok": ok, "reason": "r",
                                                                                      "phases": phases}})


def test_status_shows_the_measurement_of_heads_tree_and_calls_another_trees_stale():
    st = throughput_state([_ev("T", ratio=0.98)], "T")
    assert st["state"] == "measured" and st["phases"]["prefill"]["ratio"] == 0.98
    lines = throughput_lines(st)
    assert lines[0].startswith("prefill: 980.0 t/s (0.98x upstream, fast") and lines[1].startswith("decode:")
    stale = throughput_lines(throughput_state([_ev("T")], "U"))
    assert all("stale" in line for line in stale)
    slow = throughput_lines(throughput_state([_ev("T", ok=False, ratio=0.5)], "T"))
    assert "SLOW" in slow[0]
    assert throughput_lines(throughput_state([], "T")) == ["throughput: unmeasured (no throughput record)"]
    cut = _ev("T")
    cut.verdict.phases[0].margin = None  # a record without the figures the gate writes is no measurement
    assert throughput_state([cut], "T")["state"] == "unmeasured"
    assert throughput_state([_ev("T", ratio=0.9), cut], "T")["phases"]["prefill"]["ratio"] == 0.9


def test_throughput_is_due_once_per_backend_tree_after_e2e_passed_there():
    assert throughput_due([], "T", prefill_verified_here=False) == (False, "e2e has not passed on this backend tree")
    assert throughput_due([], "T", prefill_verified_here=True)[0]
    assert not throughput_due([_ev("T")], "T", prefill_verified_here=True)[0]
    assert throughput_due([_ev("T")], "U", prefill_verified_here=True)[0]


# -- porter run's wiring: e2e then throughput, once per backend tree ------------------------------------

def test_run_measures_throughput_after_e2e_and_alone_where_e2e_passed_before(gate_env, monkeypatch):
    """porter.run.end_to_end with stand-in gates: a new backend tree gets e2e then throughput, both
    recorded; nothing is due again on that tree; a tree e2e passed on without a throughput record
    (an older porter, a run cut short) gets throughput alone, with e2e's record standing for its need."""
    import porter.run as run_mod
    from porter.gates import registry
    from porter.gates.e2e.state import E2E_UNIT
    from porter.gates.result import GateResult
    from porter.records.evidence import store_evidence
    from porter.records.history import typed

    ws, target = gate_env.ws, gate_env.target
    ledger: list = []
    chains: list[tuple] = []
    output, speed = registry.names(registry.BACKEND, role=registry.OUTPUT), registry.names(registry.BACKEND,
                                                                                           role=registry.SPEED)
    for u in target.units:  # every unit ported (the anchor's file is what the library build reads)
        target.unit_path(u).parent.mkdir(parents=True, exist_ok=True)
        target.unit_path(u).write_text(f"// {u}\n")
    subprocess.run(["git", "add", "-A"], cwd=ws, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ported"], cwd=ws, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout.strip()
    tree_hash = tree.tree_hash_worktree(ws, tree.backend_dirs(target))

    class Out:
        lines: list = []

        def line(self, text, style=None):
            self.lines.append(text)

    class StandInRun:
        parity_ok, out = True, Out()

        def history(self):
            return types.SimpleNamespace(mine=list(ledger))

        def _record_gate(self, unit, attempt, res):
            ev = {"target": target.name, "unit": unit, "gate": res.gate, "ok": res.ok, "candidate_sha256": None,
                  "toolchain": {}, "summary": res.summary, **res.evidence}
            ledger.append(typed(len(ledger) + 1, {"kind": "gate", "gate": res.gate, "target": target.name,
                                                  "unit": unit, "ok": res.ok, "evidence": store_evidence(ws, ev)}))

    def fake_gates(candidate, ctx, gates=None, on_result=None):
        if candidate.unit != E2E_UNIT:  # the library the backend gates load
            return [GateResult(gates[-1], True, "built")]
        chains.append((tuple(gates), tuple(n for n in ctx.results)))
        out = []
        for g in gates:
            if not all(n in ctx.results or n in [r.gate for r in out] for n in registry.get(g).needs):
                break
            ev = {"tree_hash": tree_hash, "commit": head}
            if g in speed:
                ev["verdict"] = {"ok": True, "reason": "fast", "phases": [
                    {"phase": ph, "ok": True, "upstream_tps": 100.0, "candidate_tps": 99.0, "ratio": 0.99,
                     "margin": 0.03, "p_value": 0.4} for ph in tp.PHASES]}
            res = GateResult(g, True, f"{g} ok", evidence=ev)
            out.append(res)
            on_result(res)
        return out

    report = types.SimpleNamespace(units=[types.SimpleNamespace(unit=u, state="verified", tier="prefill")
                                          for u in target.units])
    monkeypatch.setattr(run_mod, "derive", lambda ws, target: report)
    monkeypatch.setattr(run_mod, "run_gates", fake_gates)

    run_mod.end_to_end(ws, target, StandInRun())
    assert chains == [(output + speed, ())]
    assert [r.gate for r in ledger] == list(output + speed)
    run_mod.end_to_end(ws, target, StandInRun())
    assert len(chains) == 1, "nothing is due on a measured tree"

    del ledger[1:]  # e2e passed on this tree, its throughput never measured
    run_mod.end_to_end(ws, target, StandInRun())
    assert chains[-1] == (speed, output), "throughput alone, e2e's record standing for its need"
    assert [r.gate for r in ledger] == list(output + speed)
    assert any(line.startswith("throughput: throughput ok") for line in Out.lines)


def test_ds4s_runner_skips_on_upstreams_build_and_fails_on_the_candidates(ds4_driver, monkeypatch, tmp_path):
    """Which side failed to build decides: upstream's is no verdict (skipped), the candidate's is its own."""
    target = types.SimpleNamespace(spec=types.SimpleNamespace(e2e=types.SimpleNamespace(layers=5, prompt_tokens=64,
                                                                                        options={})))
    monkeypatch.setattr(ds4_driver.Ds4Reduced, "ensure_model", lambda self, log=print: self.model)
    built = []

    def build(self, v, program="ds4"):
        built.append((v.name, program))
        if v.name in failing:
            raise PorterError(f"ds4 build {v.name} failed: nvcc error")
        return tmp_path / v.name

    monkeypatch.setattr(ds4_driver.Ds4Reduced, "build", build)
    failing = {"upstream-cuda"}
    with pytest.raises(ReferenceFailure, match="upstream's ds4-bench"):
        ds4_driver.throughput_runner(target, tmp_path, tmp_path / "lib.so", None, prefill_tokens=PRE,
                                     decode_tokens=DEC, log=lambda *_: None)
    failing = {"candidate"}
    with pytest.raises(PorterError, match="candidate failed") as err:
        ds4_driver.throughput_runner(target, tmp_path, tmp_path / "lib.so", None, prefill_tokens=PRE,
                                     decode_tokens=DEC, log=lambda *_: None)
    assert not isinstance(err.value, ReferenceFailure)
    failing = set()
    built.clear()
    bench = ds4_driver.throughput_runner(target, tmp_path, None, None, prefill_tokens=PRE, decode_tokens=DEC,
                                         log=lambda *_: None)
    assert built == [("upstream-cuda", "ds4-bench")], "A/A: one build, the same executable on both sides"
    assert bench.builds[tp.UPSTREAM] == bench.builds[tp.CANDIDATE]
    assert len((tmp_path / "bench-prompt.txt").read_text()) >= PRE
