"""ds4 parity specs calibrated against the upstream CUDA backend of a ds4 checkout.

Needs the checkout ($PORTER_DS4_SOURCE, or external/ds4 in the repository --
never committed); the GPU part also needs cupy, an NVIDIA GPU and nvcc with
cuBLAS.  Each part skips with its reason otherwise.

Without a GPU: the mutant manifest applies to the checkout (every anchor
exactly once), a manifest rule that matches zero or two times is refused with
one line, every ds4 spec validates against ds4_gpu.h and builds its inputs and
references for two seeds with identical layouts.

With a GPU (one session-wide run of porter.calibration.calibrator.calibrate): every spec
passes against the upstream library, and every mutant of targets/ds4/mutants.toml
fails its unit's spec by the check the manifest names -- among them the routed
experts' IQ2_XXS blocks decoded as Q8_0.  PORTER_DS4_REPORT=FILE keeps the report.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import NO_DS4

from porter.errors import PorterError
from porter.calibration.calibrator import CalibrateOptions, calibrate, table
from porter.calibration.libraries import UpstreamLibraries, build_upstream, libraries_for
from porter.gates.mutants import Mutant, Rule, rule_mutants
from porter.gates.driver import ParityOptions

REPO = Path(__file__).resolve().parents[1]
REQUIRED_UNITS = {"ds4_gpu_rms_norm_plain_rows_tensor", "ds4_gpu_matmul_q8_0_tensor", "ds4_gpu_rope_tail_tensor",
                  "ds4_gpu_swiglu_tensor", "ds4_gpu_indexer_topk_tensor", "ds4_gpu_routed_moe_one_tensor"}


def _checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file() and (p / "ds4_cuda.cu").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4 + " (the ds4 specs and mutants are checked against it)")


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


# ---------------------------------------------------------------------------
# mutations (no GPU)
# ---------------------------------------------------------------------------

def _mut(*rules):
    return Mutant("u", "m", "values", "why", "rules", file="f.cu", rules=tuple(Rule(s, r) for s, r in rules))


def test_apply_mutation_needs_exactly_one_match():
    assert _mut(("x", "y")).apply("a x b") == "a y b"
    with pytest.raises(PorterError, match="occurs 0 times"):
        _mut(("x", "y")).apply("a b")
    with pytest.raises(PorterError, match="occurs 2 times"):
        _mut(("x", "y")).apply("x x")
    # rules apply in order, each to the text the previous one left
    assert _mut(("a", "c"), ("cb", "d")).apply("ab") == "d"


def test_load_mutations_refuses_bad_manifests(tmp_path):
    class T:
        dir = tmp_path

    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\nfile="f"\nmust_fail_check="nope"\n'
                                           'why="w"\n[[mutant.rule]]\nsearch="x"\nreplace="y"\n')
    with pytest.raises(PorterError, match="unknown check"):
        rule_mutants(T)
    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\nfile="f"\nmust_fail_check="values"\n'
                                           'why="w"\n[[mutant.rule]]\nsearch="x"\nreplace="x"\n')
    with pytest.raises(PorterError, match="replace equals search"):
        rule_mutants(T)
    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\n')
    with pytest.raises(PorterError, match="lacks"):
        rule_mutants(T)


@needs_checkout
def test_every_manifest_mutant_applies_once_to_the_checkout(target):
    muts = rule_mutants(target)
    assert any(m.unit == "ds4_gpu_routed_moe_one_tensor" and "q8_0" in m.name for m in muts)
    src = (target.checkout / "ds4_cuda.cu").read_text()
    for m in muts:
        out = m.apply(src)
        assert out != src and "porter mutant" in out
        assert m.unit in {f.name for f in target.api}


@needs_checkout
def test_build_refuses_a_checkout_without_the_backend(target, tmp_path):
    import copy

    t = copy.copy(target)
    t.checkout = tmp_path
    with pytest.raises(PorterError, match="lacks ds4_cuda.cu"):
        build_upstream(t, None, tmp_path / "out")


@needs_checkout
def test_porter_calibrate_known_good_upstream_builds_from_the_checkout_and_runs_its_mutants(target, monkeypatch,
                                                                                             tmp_path):
    """`porter calibrate --known-good upstream` builds the checkout's backend AND every mutants.toml rule:
    a spec is recorded as calibrated only with its mutants (it used to run none)."""
    import porter.calibration.libraries as libs_mod
    from porter.calibration.calibrator import select_mutants

    lib = tmp_path / "libds4_cuda.so"
    lib.write_bytes(b"")
    seen = []
    monkeypatch.setattr(libs_mod, "build_upstream", lambda t, m=None, out=None: seen.append((t.name, m)) or lib)
    libs = libraries_for(target, "upstream", tmp_path / "cache")
    assert isinstance(libs, UpstreamLibraries) and "upstream ds4" in libs.describe
    assert libs.known_good() == lib and seen == [("ds4", None)]
    opts = CalibrateOptions(tmp_path, units=None)
    chosen = select_mutants(target, libs, sorted({m.unit for m in rule_mutants(target)}), opts)
    assert {m.name for m in chosen} == {m.name for m in rule_mutants(target)} and chosen
    assert select_mutants(target, libs, [m.unit for m in chosen], CalibrateOptions(tmp_path, with_mutants=False)) == []


# ---------------------------------------------------------------------------
# specs (no GPU)
# ---------------------------------------------------------------------------

@needs_checkout
def test_ds4_specs_validate_and_build_both_seeds(target):
    from porter.gates.parity.gate import prepare, zero_answer_passes
    from porter.spec import Context, load_specs
    from porter.gates.parity.scenario import is_scenario

    specs = {u: s for u, s in load_specs(target).items() if not is_scenario(s)}  # runtime: test_runtime_scenarios
    assert REQUIRED_UNITS <= set(specs)  # load_specs validated every spec against ds4_gpu.h
    # inputs of both seeds for the specs no family test builds (tests/test_ds4_{hc,matmul,attention}_specs.py
    # build theirs; building all ~60 twice made CI minutes longer for nothing)
    own = {"ds4_gpu_rms_norm_plain_rows_tensor", "ds4_gpu_rope_tail_tensor", "ds4_gpu_swiglu_tensor",
           "ds4_gpu_indexer_topk_tensor"}
    for unit, spec in ((u, s) for u, s in specs.items() if u in own):
        cases = prepare(spec, target.api_function(unit), Context(None), [12345, 67890])
        ok = [c for c in cases if c.shape.expect == "ok"]
        assert ok and all(len(c.calls) == 2 for c in ok)
        assert any(c.shape.timed for c in cases), unit
        for c in ok:  # two seeds, two different inputs (the second call must not be answerable from the first)
            a, b = (c.calls[p].expect for p in (0, 1))
            assert any(not (a[k] == b[k]).all() for k in a), (unit, c.shape.label)
        assert zero_answer_passes(spec, cases) == [], unit  # calibration would refuse the spec


@needs_checkout
def test_rope_binds_inverse_as_a_c_bool(target):
    """ds4_gpu_rope_tail_tensor's `bool inverse`: the harness binds it as a C bool and
    accepts True/False (or 0/1) only."""
    import numpy as np

    from porter.spec import Call, InOut, SpecError, header_params, load_spec, validate_call

    fn = target.api_function("ds4_gpu_rope_tail_tensor")
    assert {p["name"]: p["kind"] for p in header_params(fn)}["inverse"] == "bool"
    spec = load_spec(target, "ds4_gpu_rope_tail_tensor")
    shape = next(s for s in spec.shapes if s.expect == "ok")
    call = spec.build(shape, None, np.random.default_rng(0))
    assert isinstance(call.args["inverse"], bool)
    validate_call(spec, fn, shape, call)
    for bad in (2, 0.5):
        with pytest.raises(SpecError, match="inverse"):
            validate_call(spec, fn, shape, Call(args={**call.args, "inverse": bad}, expect=call.expect))
    assert isinstance(call.args["x"], InOut)


# ---------------------------------------------------------------------------
# the specs end to end in host mode (no GPU): a C stand-in of three ops
# ---------------------------------------------------------------------------

# Our own plain-C versions of three ds4 ops (written for this test from the
# semantics in reference/ds4_ops.py), with switchable faults: the parity child
# runs them in host memory ("host" mode), so the specs, the C `bool` binding,
# ds4's non-zero-success convention and the checks meant to catch each fault
# are exercised in CI.
STAND_IN_C = r"""
#include <stdint.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
typedef struct { void *ptr; uint64_t bytes; int owner; } T;
int ds4_gpu_init(void) { return 1; }
int ds4_gpu_swiglu_tensor(T *out, const T *gate, const T *up, uint32_t n, float clamp, float weight) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !gate || !up) return 0;
#endif
  float *o = out->ptr; const float *g = gate->ptr, *u = up->ptr;
#ifdef FAULT_WEIGHT_IGNORED
  weight = 1.0f;
#endif
  for (uint32_t i = 0; i < n; i++) { float a = g[i], b = u[i];
    if (clamp > 1e-6f) { a = fminf(a, clamp); b = fminf(fmaxf(b, -clamp), clamp); }
#ifdef FAULT_SIGMOID_OVERFLOWS
    o[i] = a * (expf(a) / (1.0f + expf(a))) * b * weight;
#else
    o[i] = a / (1.0f + expf(-a)) * b * weight;
#endif
    /* an env-knob "path" that is wrong: the calibrator's variant runs must see it */
    if (getenv("PORTER_TEST_SWIGLU_ALT_PATH")) o[i] = a * b * weight; }
  return 1;
}
int ds4_gpu_rope_tail_tensor(T *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t n_rot,
    uint32_t pos0, uint32_t n_ctx_orig, bool inverse, float freq_base, float freq_scale, float ext_factor,
    float attn_factor, float beta_fast, float beta_slow) {
#ifndef FAULT_NO_NULL_CHECK
  if (!x) return 0;
#endif
  if (n_rot > head_dim || (n_rot & 1)) return 0;
  double lo = 0, hi = 0, pi = 3.14159265358979323846;
  if (ext_factor != 0) { double den = 2 * log(freq_base);
    lo = fmax(0, floor(n_rot * log(n_ctx_orig / (beta_fast * 2 * pi)) / den));
    hi = fmin(n_rot - 1, ceil(n_rot * log(n_ctx_orig / (beta_slow * 2 * pi)) / den)); }
  for (uint32_t t = 0; t < n_tok; t++) for (uint32_t h = 0; h < n_head; h++) for (uint32_t i = 0; i < n_rot; i += 2) {
    double te = (double)(pos0 + t) * pow(freq_base, -(double)i / n_rot), ti = freq_scale * te, th = ti, ms = attn_factor;
    if (ext_factor != 0) { double r = (1 - fmin(1, fmax(0, ((i / 2) - lo) / fmax(0.001, hi - lo)))) * ext_factor;
      th = ti * (1 - r) + te * r; ms *= 1 + 0.1 * log(1.0 / freq_scale); }
#ifdef FAULT_INVERSE_IGNORED
    double c = cos(th) * ms, s = sin(th) * ms;
#else
    double c = cos(th) * ms, s = sin(th) * ms * (inverse ? -1 : 1);
#endif
    float *tail = (float *)x->ptr + ((uint64_t)t * n_head + h) * head_dim + head_dim - n_rot;
    double x0 = tail[i], x1 = tail[i + 1]; tail[i] = x0 * c - x1 * s; tail[i + 1] = x0 * s + x1 * c; }
  return 1;
}
int ds4_gpu_indexer_topk_tensor(T *sel, const T *scores, uint32_t n_comp, uint32_t n_tokens, uint32_t top_k) {
#ifndef FAULT_NO_NULL_CHECK
  if (!sel || !scores) return 0;
#endif
  if (!n_comp || !n_tokens || !top_k || top_k > n_comp) return 0;
  for (uint32_t t = 0; t < n_tokens; t++) {
    const float *r = (const float *)scores->ptr + (uint64_t)t * n_comp;
    uint32_t *s = (uint32_t *)sel->ptr + (uint64_t)t * top_k;
    for (uint32_t c = 0; c < n_comp; c++) for (uint32_t k = 0; k < top_k; k++)
#ifdef FAULT_TIES_HIGHER_FIRST
      if (k >= c || r[c] >= r[s[k]]) {
#else
      if (k >= c || r[c] > r[s[k]]) {
#endif
        for (uint32_t j = top_k - 1; j > k; j--) s[j] = s[j - 1];
        s[k] = c; break; }
  }
  return 1;
}
"""


def _stand_in(tmp_path, *defines) -> Path:
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) for the host stand-in")
    src = tmp_path / "stand_in.c"
    src.write_text(STAND_IN_C)
    lib = tmp_path / ("libstand_in" + "".join(d.lower() for d in defines) + ".so")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", *[f"-D{d}" for d in defines], "-o", str(lib), str(src), "-lm"],
                   check=True, capture_output=True)
    return lib


@needs_checkout
@pytest.mark.parametrize("unit,fault,check", [
    ("ds4_gpu_swiglu_tensor", None, "pass"),
    ("ds4_gpu_rope_tail_tensor", None, "pass"),
    ("ds4_gpu_indexer_topk_tensor", None, "pass"),
    ("ds4_gpu_rope_tail_tensor", "FAULT_INVERSE_IGNORED", "values"),
    ("ds4_gpu_indexer_topk_tensor", "FAULT_TIES_HIGHER_FIRST", "tie-rule"),
    ("ds4_gpu_swiglu_tensor", "FAULT_SIGMOID_OVERFLOWS", "values"),  # only the edge cases reach g > 88.7
])
def test_specs_in_host_mode_accept_a_right_stand_in_and_name_the_fault(target, tmp_path, unit, fault, check):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec
    lib = _stand_in(tmp_path, *([fault] if fault else []))
    res = run_spec(target, load_spec(target, unit), lib, workspace=tmp_path, mode="host", timing_reps=0)
    assert res.word == check, res.summary


class _StandIns:
    """A library builder over host stand-ins: the right one, and one compiled with a fault per mutant."""

    describe = "host stand-in"

    def __init__(self, tmp_path):
        self.tmp = tmp_path

    def has(self, unit):
        return True

    def prepare(self, mutants, progress=None):
        pass

    def known_good(self):
        return _stand_in(self.tmp)

    def mutant(self, m):
        return _stand_in(self.tmp, m.file)


@needs_checkout
def test_calibrate_records_a_spec_calibrated_only_with_its_mutants_rejected(target, tmp_path, monkeypatch):
    """The calibrator end to end in host mode: a spec whose known-good passed and whose mutant was
    rejected by its check is calibrated; one with no mutant is not; one never run is 'never calibrated'."""
    import porter.calibration.calibrator as cal
    from porter.spec import load_spec
    from porter.records.history import History

    topk, swiglu = "ds4_gpu_indexer_topk_tensor", "ds4_gpu_swiglu_tensor"
    ties = Mutant(topk, "ties-high", "tie-rule", "ties rank the higher index first", "rules",
                  file="FAULT_TIES_HIGHER_FIRST")
    monkeypatch.setattr(cal, "load_mutants", lambda t: [ties])
    ws = tmp_path / "ws"
    ws.mkdir()
    opts = CalibrateOptions(ws, units=[topk, swiglu], parity=ParityOptions(mode="host", timing_reps=0))
    rep = calibrate(target, _StandIns(tmp_path), opts, out=lambda *a: None)
    assert [(r["unit"], r["kind"], r["got"], r["ok"]) for r in rep["rows"]] == [
        (topk, "known-good", "pass", True), (topk, "rules", "tie-rule", True), (swiglu, "known-good", "pass", True)]
    history = History.read(ws, "ds4")
    assert history.calibration_status(topk, load_spec(target, topk).sha256)["calibrated"]
    st = history.calibration_status(swiglu, load_spec(target, swiglu).sha256)
    assert not st["calibrated"] and "no mutant" in st["reason"]
    st = history.calibration_status("ds4_gpu_rope_tail_tensor", load_spec(target, "ds4_gpu_rope_tail_tensor").sha256)
    assert not st["calibrated"] and "never calibrated" in st["reason"]


# ---------------------------------------------------------------------------
# calibration on the GPU
# ---------------------------------------------------------------------------

def _gpu_skip_reason() -> str | None:
    if CHECKOUT is None:
        return NO_DS4
    from porter.gates.parity import available

    ok, why = available()
    if not ok:
        return f"parity gate unavailable here: {why}"
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "nvcc not on PATH: cannot build the upstream backend"
    inc = Path(nvcc).resolve().parent.parent / "include" / "cublas_v2.h"
    if not inc.is_file() and not Path("/usr/include/cublas_v2.h").is_file():
        return f"no cuBLAS headers ({inc}): the upstream backend needs cuBLAS"
    return None


@pytest.fixture(scope="module")
def report(request):
    why = _gpu_skip_reason()
    if why:  # before the target fixture: without a checkout it cannot load, and that is a skip, not an error
        pytest.skip(why)
    target = request.getfixturevalue("target")
    out_dir = os.environ.get("PORTER_KNOWN_GOOD_DIR")
    libs = UpstreamLibraries(target, Path(out_dir) if out_dir else None)
    rep = calibrate(target, libs, CalibrateOptions(REPO, parity=ParityOptions(timeout=180.0), ledger=False))
    print("\n" + table(rep))
    if os.environ.get("PORTER_DS4_REPORT"):
        Path(os.environ["PORTER_DS4_REPORT"]).write_text(json.dumps(rep, indent=1, default=str))
    return rep


@pytest.mark.gpu
def test_upstream_passes_every_ds4_spec(report):
    good = {r["unit"]: r for r in report["rows"] if r["kind"] == "known-good"}
    assert REQUIRED_UNITS <= set(good)
    bad = {u: r["summary"] for u, r in good.items() if not r["ok"]}
    assert not bad, bad


@pytest.mark.gpu
def test_every_mutant_is_rejected_by_its_check(report):
    muts = [r for r in report["rows"] if r["kind"] == "rules"]
    assert any(r["name"] == "iq2_xxs-as-q8_0" for r in muts)
    wrong = {r["name"]: f"want {r['expect']}, got {r['got']}: {r['summary']}" for r in muts if not r["ok"]}
    assert not wrong, wrong


@needs_checkout
def test_a_spec_refusing_an_env_knob_variant_of_the_known_good_is_not_calibrated(target, tmp_path, monkeypatch):
    """Each known-good variant (upstream with env knobs) runs in the parity child with its env: one the
    spec accepts is a passing row; one it refuses (here a stand-in whose knob path is wrong) makes the
    spec uncalibrated, since such a spec would refuse a correct port that took upstream's other path."""
    import porter.calibration.calibrator as cal
    from porter.calibration.variants import Variant
    from porter.spec import load_spec
    from porter.records.history import History

    swiglu = "ds4_gpu_swiglu_tensor"
    no_weight = Mutant(swiglu, "no-weight", "values", "weight ignored", "rules", file="FAULT_WEIGHT_IGNORED")
    monkeypatch.setattr(cal, "load_mutants", lambda t: [no_weight])

    class Plan:
        def __init__(self, target):
            pass

        def for_unit(self, unit):
            return [Variant("harmless", "a knob this path ignores", {"PORTER_TEST_UNREAD_KNOB": "1"}),
                    Variant("alt-path", "the stand-in's wrong knob path", {"PORTER_TEST_SWIGLU_ALT_PATH": "1"})]

    monkeypatch.setattr(cal, "VariantPlan", Plan)
    monkeypatch.setattr(cal, "UpstreamLibraries", _StandIns)  # variants run for upstream builders only
    ws = tmp_path / "ws"
    ws.mkdir()
    opts = CalibrateOptions(ws, units=[swiglu], parity=ParityOptions(mode="host", timing_reps=0))
    rep = calibrate(target, _StandIns(tmp_path), opts, out=lambda *a: None)
    rows = [(r["kind"], r["name"], r["got"], r["ok"]) for r in rep["rows"]]
    assert rows == [("known-good", "host stand-in", "pass", True), ("variant", "harmless", "pass", True),
                    ("variant", "alt-path", "values", False), ("rules", "no-weight", "values", True)], rows
    assert "PORTER_TEST_SWIGLU_ALT_PATH" not in __import__("os").environ, "a variant's env leaked into porter"
    st = History.read(ws, "ds4").calibration_status(swiglu, load_spec(target, swiglu).sha256)
    assert not st["calibrated"] and "refuses 1 of upstream's 2 env-knob variants" in st["reason"], st
    assert cal.matrix(rep).splitlines()[1].split()[1] == "X"


@needs_checkout
def test_units_calibrated_side_by_side_give_the_rows_of_one_at_a_time(target, tmp_path, monkeypatch):
    """--jobs N: units run in threads (their GPU runs still take turns in the worker pool); rows keep
    the units' order and each unit's printed lines stay together."""
    import porter.calibration.calibrator as cal

    topk, rope, swiglu = "ds4_gpu_indexer_topk_tensor", "ds4_gpu_rope_tail_tensor", "ds4_gpu_swiglu_tensor"
    mutants = [Mutant(topk, "ties-high", "tie-rule", "ties", "rules", file="FAULT_TIES_HIGHER_FIRST"),
               Mutant(rope, "inverse", "values", "inverse ignored", "rules", file="FAULT_INVERSE_IGNORED")]
    monkeypatch.setattr(cal, "load_mutants", lambda t: mutants)
    got = {}
    for jobs in (1, 3):
        ws = tmp_path / f"ws{jobs}"
        ws.mkdir()
        lines = []
        opts = CalibrateOptions(ws, units=[topk, rope, swiglu], parity=ParityOptions(mode="host", timing_reps=0),
                                ledger=False, jobs=jobs)
        rep = calibrate(target, _StandIns(tmp_path), opts, out=lines.append)
        got[jobs] = [(r["unit"], r["kind"], r["name"], r["got"], r["ok"]) for r in rep["rows"]]
        units_in_print = [next(u for u in (topk, rope, swiglu) if u in ln) for ln in lines if ln.startswith("  ")
                          and not ln.startswith("      ")]
        assert sorted(units_in_print) == sorted([topk, rope, swiglu])
        for u in (topk, rope):  # the mutant line follows its own unit's line
            i = next(k for k, ln in enumerate(lines) if ln.startswith("  ") and u in ln)
            assert lines[i + 1].startswith("      ok "), lines
    assert got[1] == got[3] and [g[0] for g in got[3]] == [topk, topk, rope, rope, swiglu]
