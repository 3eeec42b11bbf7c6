"""The port's accuracy in the field's units (porter.gates.e2e.accuracy), on the CPU: the streamed agreement
equals compare.logit_agreement, a dump the engine could have written wrong (cut, reordered, a link, too big)
is refused with a one-line reason, a port whose rows are shuffled or not finite reads as what it is, and
the figures reach the throughput record, status and its JSON.  ds4's hook: its patch rule applies exactly
once to the checkout, only to the throughput builds, and the patched ds4.c compiles.
"""

from __future__ import annotations

import json

import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from porter.errors import PorterError
from porter.gates.e2e import accuracy as acc
from porter.gates.e2e import throughput as tp
from porter.gates.e2e import throughput_gate
from porter.gates.e2e.compare import ReferenceFailure, logit_agreement
from porter.gates.e2e.throughput_state import throughput_lines, throughput_state
from porter.gates.evidence import ThroughputEvidence
from porter.target.code import load_file

ROOT = Path(__file__).resolve().parents[1]
V = 257  # a small vocabulary: the format and the arithmetic do not depend on the width


def write_dump(path: Path, rows: np.ndarray, positions=None) -> Path:
    rows = np.asarray(rows, dtype=np.float32)
    pos = np.arange(len(rows)) if positions is None else np.asarray(positions)
    rec = np.zeros(len(rows), dtype=acc._dtype(rows.shape[1]))
    rec["pos"], rec["logits"] = pos, rows
    path.write_bytes(rec.tobytes())
    return path


def logits(n=2048, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, (n, V)).astype(np.float32)


# -- the arithmetic and the reader ------------------------------------------------------------------------

@pytest.mark.parametrize("block", [1, 7, 32, 5000])
def test_the_streamed_agreement_is_logit_agreement_on_the_whole(tmp_path, block):
    ref = logits(300)
    cand = ref + np.random.default_rng(1).normal(0, 0.05, ref.shape).astype(np.float32)
    cand[17, 3] = np.nan  # one non-finite row: infinite divergence, a different top token
    cand[40] = ref[41]
    whole = logit_agreement(ref, cand)
    got = acc.agreement_of_dumps(write_dump(tmp_path / "r", ref), write_dump(tmp_path / "c", cand), V, 300, block)
    assert got.keys() == whole.keys()
    for k in whole:
        assert got[k] == pytest.approx(whole[k], rel=1e-12), k
    assert got["max_kld"] == float("inf") and got["same_top"] < 1


def test_identical_dumps_agree_exactly(tmp_path):
    ref = logits(64)
    a = acc.agreement_of_dumps(write_dump(tmp_path / "r", ref), write_dump(tmp_path / "c", ref), V, 64)
    assert a == {"positions": 64, "mean_kld": 0.0, "p99_kld": 0.0, "max_kld": 0.0, "same_top": 1.0,
                 "non_finite_rows": 0}


@pytest.mark.parametrize("damage, words", [
    (lambda p: p.write_bytes(p.read_bytes()[:-3]), "not a whole number of 1032-byte logits records"),
    (lambda p: p.write_bytes(b""), "0 bytes is not a whole number"),
    (lambda p: write_dump(p, logits(64), positions=[*range(5), 6, 5, *range(7, 64)]), "record 5 is position 6"),
    (lambda p: write_dump(p, logits(64), positions=[0] * 64), "record 1 is position 0"),
    (lambda p: write_dump(p, logits(63)), "63 positions of logits, expected 64"),
    (lambda p: write_dump(p, logits(65)), "more than the"),
    (lambda p: p.unlink(), "wrote no c"),
])
def test_a_dump_that_is_not_what_the_hook_writes_is_refused_in_one_line(tmp_path, damage, words):
    ref = write_dump(tmp_path / "r", logits(64))
    cand = write_dump(tmp_path / "c", logits(64))
    damage(cand)
    with pytest.raises(PorterError, match=words) as err:
        acc.agreement_of_dumps(ref, cand, V, 64)
    assert not isinstance(err.value, ReferenceFailure) and "\n" not in str(err.value)


def test_a_link_in_place_of_the_dump_is_refused(tmp_path):
    ref = write_dump(tmp_path / "r", logits(8))
    (tmp_path / "c").symlink_to(ref)
    with pytest.raises(PorterError, match="not a file porter reads"):
        acc.agreement_of_dumps(ref, tmp_path / "c", V, 8)


def test_a_bad_reference_dump_is_the_references_failure(tmp_path):
    ref = write_dump(tmp_path / "r", logits(8))
    ref.write_bytes(ref.read_bytes()[:-1])
    with pytest.raises(ReferenceFailure, match="the reference's logits"):
        acc.agreement_of_dumps(ref, write_dump(tmp_path / "c", logits(8)), V, 8)


# -- measure: upstream twice, then the port --------------------------------------------------------------

class Engines:
    """A runner's logit_rows: upstream's rows (with a little run-to-run noise), the port's made by `port`."""

    n_vocab = V

    def __init__(self, tmp: Path, port=lambda rows: rows, fail_on=None, n=2048):
        self.tmp, self.port, self.fail_on, self.n = tmp, port, fail_on, n
        self.base = logits(n)
        self.calls = []

    def logit_rows(self, backend):
        self.calls.append(backend)
        if backend == self.fail_on:
            raise PorterError(f"{backend} engine crashed")
        rng = np.random.default_rng(len(self.calls))
        rows = self.base + rng.normal(0, 1e-3, self.base.shape).astype(np.float32)
        if backend == tp.CANDIDATE:
            rows = self.port(rows)
        return write_dump(self.tmp / f"{backend}-{len(self.calls)}.f32", rows)


def test_a_good_port_reads_near_upstreams_own_floor_and_the_dumps_are_removed(tmp_path):
    eng = Engines(tmp_path)
    res = acc.measure(eng, V, 2048, log=lambda *_: None)
    assert eng.calls == [tp.UPSTREAM, tp.UPSTREAM, tp.CANDIDATE]
    assert res["positions"] == 2048 and res["same_top"] > 0.99 and res["mean_kld"] < 1e-5
    assert res["upstream_aa"]["positions"] == 2048 and res["upstream_aa"]["mean_kld"] < 1e-5
    assert res["rule"] == acc.RULE and list(tmp_path.iterdir()) == []
    line = acc.accuracy_line(res)
    assert line.startswith("accuracy: mean KLD ") and "over 2048 positions vs upstream" in line
    assert "llama.cpp BF16 vs FP16: ~2.5e-5, ~99.7%" in line and "calibrated e2e NMSE rule" in line


@pytest.mark.parametrize("port, check", [
    # rows of other positions: every distribution wrong, the top token right only by chance
    (lambda r: r[np.random.default_rng(5).permutation(len(r))], lambda a: a["mean_kld"] > 1 and a["same_top"] < 0.05),
    # non-finite rows: an infinite divergence, kept as None with the count (standard JSON has no infinity)
    (lambda r: np.full_like(r, np.nan),
     lambda a: a["mean_kld"] is None and a["non_finite_rows"] == 2048 and a["same_top"] == 0.0),
    (lambda r: np.where(np.arange(len(r))[:, None] == 100, np.inf, r),
     lambda a: a["max_kld"] is None and a["mean_kld"] is None and a["non_finite_rows"] == 1
     and 0.99 < a["same_top"] < 1),
    (lambda r: r * 0.5, lambda a: a["mean_kld"] > 100 * a["upstream_aa"]["mean_kld"]),  # a lost scale
])
def test_a_broken_port_reads_as_what_it_is(tmp_path, port, check):
    res = acc.measure(Engines(tmp_path, port), V, 2048, log=lambda *_: None)
    assert check(res), res
    json.dumps(res, allow_nan=False)  # what status --json prints must be standard JSON
    line = acc.accuracy_line(res)
    assert line.startswith("accuracy: the port's logits are not finite on") if res.get("non_finite_rows") else \
        line.startswith("accuracy: mean KLD"), line


def test_the_ports_failure_is_flagged_and_upstreams_is_no_measurement(tmp_path):
    res = acc.measure(Engines(tmp_path, fail_on=tp.CANDIDATE), V, 2048, log=lambda *_: None)
    assert "candidate engine crashed" in res["failed"] and res["upstream_aa"]["positions"] == 2048
    assert acc.accuracy_line(res).startswith("accuracy: FAILED: the port's logits")
    cut = Engines(tmp_path, port=lambda r: r[:-1])
    assert "2047 positions" in acc.measure(cut, V, 2048, log=lambda *_: None)["failed"]
    res = acc.measure(Engines(tmp_path, fail_on=tp.UPSTREAM), V, 2048, log=lambda *_: None)
    assert set(res) == {"skipped"} and acc.accuracy_line(res).startswith("accuracy: not measured (upstream's")
    assert "fewer than the 2000" in acc.measure(Engines(tmp_path, n=64), V, 64)["skipped"]
    assert list(tmp_path.iterdir()) == []


# -- the throughput gate records it; status and --json show it -------------------------------------------

def _record(tree_hash, accuracy):
    phases = [{"phase": ph, "ok": True, "upstream_tps": 1000.0, "candidate_tps": 1000.0, "ratio": 1.0,
               "margin": 0.02, "p_value": 0.5} for ph in tp.PHASES]
    return ThroughputEvidence.of({"gate": "throughput", "unit": "e2e:prefill", "target": "t", "ok": True,
                                  "tree_hash": tree_hash, "commit": "c0ffee" * 6, "accuracy": accuracy,
                                  "verdict": {"ok": True, "reason": "r", "phases": phases}})


FIGURES = {"positions": 2048, "mean_kld": 3.1e-05, "p99_kld": 2.0e-4, "max_kld": 1.5e-3, "same_top": 0.996,
           "upstream_aa": {"positions": 2048, "mean_kld": 0.0, "p99_kld": 0.0, "max_kld": 0.0, "same_top": 1.0},
           "rule": acc.RULE}


def test_status_prints_the_accuracy_line_and_json_carries_the_figures():
    import json

    st = throughput_state([_record("T", FIGURES)], "T")
    assert st["accuracy"]["mean_kld"] == 3.1e-05 and st["accuracy"]["upstream_aa"]["same_top"] == 1.0
    assert json.loads(json.dumps(st))["accuracy"]["positions"] == 2048
    line = throughput_lines(st)[-1]
    assert line == ("accuracy (at c0ffeec0ffee): mean KLD 3.1e-05 (p99 0.0002), same top token 99.6% over 2048 "
                    "positions vs upstream; upstream against itself 0, 100.0% (llama.cpp BF16 vs FP16: ~2.5e-5, "
                    "~99.7%); reported beside the verdict, which is the calibrated e2e NMSE rule's")
    assert "stale" in throughput_lines(throughput_state([_record("T", FIGURES)], "U"))[-1]
    failed = throughput_lines(throughput_state([_record("T", {"failed": "the port's logits: cut"})], "T"))[-1]
    assert failed.startswith("accuracy (at c0ffeec0ffee): FAILED: the port's logits")
    assert len(throughput_lines(throughput_state([_record("T", None)], "T"))) == 2  # an older record: none
    cut = throughput_lines(throughput_state([_record("T", {"positions": 2048})], "T"))[-1]
    assert "not measured" in cut


# -- ds4's hook ----------------------------------------------------------------------------------------

def _checkout() -> Path:
    from conftest import NO_DS4, ds4_checkout

    src = ds4_checkout()
    if src is None:
        pytest.skip(NO_DS4)
    return src


@pytest.fixture(scope="module")
def d4():
    return load_file(ROOT / "targets" / "ds4" / "e2e" / "driver.py")


@pytest.fixture(scope="module")
def ds4_target():
    from porter.target import load_target

    return load_target(ROOT, "ds4", _checkout())


def test_the_hook_applies_once_to_the_throughput_builds_only_and_compiles(d4, ds4_target, tmp_path):
    d = d4.scratch_copy(ds4_target, tmp_path / "acc", 5, accuracy=True)
    text = (d / "ds4.c").read_text()
    assert text.count("ds4_e2e_logit_rows(") == 2 and text.count('getenv("DS4_E2E_LOGIT_ROWS")') == 1
    assert text.count("ds4_e2e_gpu_layer(") == 2, "patches.toml's rules still apply beneath it"
    plain = (d4.scratch_copy(ds4_target, tmp_path / "e2e", 5) / "ds4.c").read_text()
    assert "ds4_e2e_logit_rows" not in plain, "the e2e gate's calibrated build is unchanged"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    for defs in (["-DDS4_NO_GPU"], []):
        res = subprocess.run([cc, "-fsyntax-only", "-std=c99", "-D_GNU_SOURCE", "-Wall", *defs, "ds4.c"], cwd=d,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "ds4_e2e_logit_rows" not in res.stderr, res.stderr[-2000:]


def test_only_variants_with_the_hook_get_another_build_key(d4, ds4_target, tmp_path):
    red = d4.Ds4Reduced(ds4_target, tmp_path)
    up = d4.Ds4Variant("upstream-cuda", "reference", source="upstream")
    hooked = d4.Ds4Variant("upstream-cuda", "reference", source="upstream", accuracy=True)
    assert red.build_key(up) != red.build_key(hooked)
    assert red.build_key(up) == red.build_key(d4.Ds4Variant("x", "good", source="upstream"))


def test_ds4_bench_dumps_every_row_with_the_hooks_variable(d4, monkeypatch, tmp_path):
    target = types.SimpleNamespace(spec=types.SimpleNamespace(e2e=types.SimpleNamespace(layers=5, prompt_tokens=64,
                                                                                        options={})))
    monkeypatch.setattr(d4.Ds4Reduced, "ensure_model", lambda self, log=print: self.model)
    built = []
    monkeypatch.setattr(d4.Ds4Reduced, "build", lambda self, v, program="ds4": built.append(v) or tmp_path / v.name)
    bench = d4.throughput_runner(target, tmp_path, tmp_path / "lib.so", None, prefill_tokens=2048, decode_tokens=128,
                                 log=lambda *_: None)
    assert all(v.accuracy for v in built) and len(built) == 2 and bench.n_vocab == d4.N_VOCAB == 129280
    seen = {}

    def run_sandboxed(what, cmd, reads, out, env):
        seen.update(what=what, cmd=cmd, env=env, out=out)
        return 1.0

    monkeypatch.setattr(d4, "run_sandboxed", run_sandboxed)
    path = bench.logit_rows(tp.CANDIDATE)
    assert path == seen["out"] / d4.LOGIT_ROWS and seen["env"]["DS4_E2E_LOGIT_ROWS"] == str(path)
    cmd = seen["cmd"]
    assert cmd[0].endswith("candidate/ds4-bench") and cmd[cmd.index("--ctx-start") + 1] == "2048"
    assert cmd[cmd.index("--gen-tokens") + 1] == "1"
    assert "accuracy" in d4.COMMANDS


def test_the_accuracy_command_prints_the_figures_and_exits_by_who_failed(d4, monkeypatch, tmp_path, capsys):
    from porter.host import sandbox

    spec = types.SimpleNamespace(prefill_tokens=2048, decode_tokens=128)
    target = types.SimpleNamespace(name="ds4", spec=types.SimpleNamespace(e2e=types.SimpleNamespace(throughput=spec)))
    monkeypatch.setattr(sandbox, "require", lambda: None)
    args = types.SimpleNamespace(library="upstream", model=None)
    asked = []
    for fail_on, rc in ((None, 0), (tp.CANDIDATE, 1), (tp.UPSTREAM, 3)):
        eng = Engines(tmp_path, fail_on=fail_on)
        monkeypatch.setattr(d4, "throughput_runner", lambda t, s, lib, *a, **k: asked.append(lib) or eng)
        assert d4._accuracy_command(target, args, tmp_path) == rc
        out = capsys.readouterr().out
        assert "against upstream's ds4-bench" in out and out.strip().splitlines()[-1].startswith("{")
        # how each side was compiled goes with the figures: a KLD between fast and IEEE math is no port's
        assert json.loads(out.strip().splitlines()[-1])["math_flags"] == {"upstream": "-O3 --use_fast_math",
                                                                          "library": "same as upstream"}
    assert asked == [None] * 3, "--library upstream: the A/A run, upstream on both sides"
    args.library = str(tmp_path / "missing.so")
    with pytest.raises(PorterError, match="no backend library"):
        d4._accuracy_command(target, args, tmp_path)
