"""The attention / KV / compressor / indexer parity specs of ds4, in host mode (no GPU).

Needs the ds4 checkout (PORTER_DS4_SOURCE or external/ds4) for ds4_gpu.h and
ds4_cuda.cu; skips without it.  Per unit: the spec loads, validates against the
header and builds inputs and references for two seeds with one layout; it has a
timed case and an error case; its DISPATCH map names upstream kernels and env
knobs that exist in ds4_cuda.cu and shapes the spec has; its mutants apply
exactly once to the checkout, at least two per unit.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from conftest import NO_DS4

REPO = Path(__file__).resolve().parents[1]
UNITS = [f"ds4_gpu_{n}_tensor" for n in (
    "indexer_score_one", "indexer_scores_prefill", "indexer_scores_decode_batch", "dsv4_fp8_kv_quantize",
    "dsv4_indexer_qat", "store_raw_kv", "store_raw_kv_batch", "kv_fp8_store_raw", "compressor_store_batch",
    "compressor_update", "compressor_prefill", "compressor_prefill_ratio4_replay",
    "compressor_prefill_state_ratio4", "attention_decode_heads", "attention_prefill_raw_heads",
    "attention_decode_raw_batch_heads", "attention_decode_mixed_batch_heads",
    "attention_indexed_mixed_batch_heads", "attention_prefill_static_mixed_heads",
    "attention_prefill_masked_mixed_heads")]
REACHED = re.compile(r"-> reached by shape '([^']+)'(?: with KNOWN_GOOD_ENV\[(\d+)\])?$")


def _checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file() and (p / "ds4_cuda.cu").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
pytestmark = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4)


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


@pytest.fixture(scope="module")
def cuda_source():
    return (CHECKOUT / "ds4_cuda.cu").read_text()


def _module(unit):
    from porter.spec import load_spec  # noqa: F401 - the loader registers the module by name

    return sys.modules[f"porter_parity_spec_ds4_{unit}"]


@pytest.mark.parametrize("unit", UNITS)
def test_spec_validates_and_builds_two_seeds(target, unit):
    from porter.gates.parity.gate import prepare
    from porter.spec import Context, load_spec

    spec = load_spec(target, unit)
    assert spec is not None and spec.unit == unit
    cases = prepare(spec, target.api_function(unit), Context(None), [12345, 67890])
    ok = [c for c in cases if c.shape.expect == "ok"]
    assert ok and all(len(c.calls) == 2 for c in ok)
    assert any(c.shape.timed for c in ok), "a real prefill or decode shape is timed"
    assert any(c.shape.expect == "error" for c in cases), "an input upstream refuses"
    assert spec.bytes_moved and all(spec.bytes_moved(c.shape) > 0 for c in ok)
    from porter.gates.parity.gate import zero_answer_passes

    assert zero_answer_passes(spec, cases) == [], "an all-zero answer passes these cases: calibration refuses the spec"
    for c in ok:  # the second seed's inputs differ, so its answer cannot come from the first call
        a, b = (c.calls[p].expect for p in (0, 1))
        assert any(not (a[k] == b[k]).all() for k in a), c.shape.label


@pytest.mark.parametrize("unit", UNITS)
def test_dispatch_map_names_upstream_kernels_knobs_and_our_shapes(target, unit, cuda_source):
    from porter.spec import load_spec

    spec = load_spec(target, unit)
    mod = _module(unit)
    dispatch, env = mod.DISPATCH, getattr(mod, "KNOWN_GOOD_ENV", [])
    labels = {s.label for s in spec.shapes if s.expect == "ok"}
    assert dispatch
    for kernel, how in dispatch.items():
        m = REACHED.search(how)
        assert m, f"{kernel}: {how!r} does not say which shape reaches it"
        assert m.group(1) in labels, f"{kernel}: no ok shape {m.group(1)!r}"
        if m.group(2) is not None:
            assert int(m.group(2)) < len(env), f"{kernel}: no KNOWN_GOOD_ENV[{m.group(2)}]"
        for ident in re.findall(r"[a-z0-9_]+_kernel\b", kernel):
            assert ident in cuda_source, f"{ident} is not an upstream kernel"
    used = {int(m.group(2)) for m in map(REACHED.search, dispatch.values()) if m.group(2) is not None}
    assert used == set(range(len(env))), "every KNOWN_GOOD_ENV setting reaches a DISPATCH entry"
    for setting in env:
        for knob in setting:
            assert f'getenv("{knob}")' in cuda_source, f"{knob} is not an upstream knob"


def test_every_unit_has_two_mutants_that_apply_once(target, cuda_source):
    from porter.gates.mutants import rule_mutants

    by_unit = {}
    for m in rule_mutants(target):
        by_unit.setdefault(m.unit, []).append(m)
    for unit in UNITS:
        muts = by_unit.get(unit, [])
        assert len(muts) >= 2, unit
        for m in muts:
            out = m.apply(cuda_source)  # raises unless every search text occurs exactly once
            assert out != cuda_source and "porter mutant" in out


def test_a_search_text_that_is_not_unique_is_refused(target, cuda_source):
    from porter.errors import PorterError
    from porter.gates.mutants import Mutant, Rule

    twice = "for (uint32_t off = 4u; off > 0u; off >>= 1u) {"  # two kernels share this reduction
    assert cuda_source.count(twice) == 2
    with pytest.raises(PorterError, match="occurs 2 times"):
        Mutant("u", "m", "values", "w", "rules", file="ds4_cuda.cu", rules=(Rule(twice, "x"),)).apply(cuda_source)
