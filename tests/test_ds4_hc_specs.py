"""The ds4 hc/norm/router specs in host mode (no GPU): each loads, validates against
ds4_gpu.h and builds its inputs and references for two seeds; each spec's DISPATCH
names exactly the kernels upstream's host function can launch (read from the
checkout's ds4_cuda.cu, following its calls into other ds4_gpu_* functions), and
names only shapes the spec has; every env knob a DISPATCH entry needs has a
KNOWN_GOOD_ENV setting; every mutant of the family applies exactly once.

Needs the ds4 checkout ($PORTER_DS4_SOURCE or external/ds4); skips without it.
"""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_DS4

REPO = Path(__file__).resolve().parents[1]
FAMILY_HEADER = "# --- hc/norm/router family ---"

HC_UNITS = [f"ds4_gpu_{n}_tensor" for n in (
    "embed_token_hc", "embed_tokens_hc", "rms_norm_plain", "rms_norm_weight_rows", "rms_norm_weight",
    "hc_weighted_sum", "output_hc_weights", "dsv4_topk_mask", "dsv4_qkv_rms_norm_rows", "head_rms_norm", "add",
    "router_select", "router_select_batch", "hc_split_sinkhorn", "hc_weighted_sum_split", "hc_split_weighted_sum",
    "hc_split_weighted_sum_norm", "hc_expand", "hc_expand_split", "hc_expand_add_split",
    "directional_steering_project", "repeat_hc")]


def _checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file() and (p / "ds4_cuda.cu").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
pytestmark = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4 + " (the specs are validated against its ds4_gpu.h and ds4_cuda.cu)")


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


@pytest.fixture(scope="module")
def cuda_src():
    return (CHECKOUT / "ds4_cuda.cu").read_text()


def _module(target, unit):
    from porter.spec import _load_module

    return _load_module(target.dir / "parity" / f"{unit}.py", "ds4hc")


# ---------------------------------------------------------------------------
# upstream's dispatch, read from the checkout
# ---------------------------------------------------------------------------

def host_body(src: str, fn: str) -> str:
    m = re.search(r'extern "C" int %s\s*\(' % re.escape(fn), src)
    assert m, f"{fn} is not defined in ds4_cuda.cu"
    i = src.index("{", src.index(")", m.end()))  # the body's opening brace, after the parameter list
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[i:j + 1]
    raise AssertionError(f"unbalanced body of {fn}")


def launched_kernels(src: str, fn: str, seen=None) -> set[str]:
    """Kernels the host function can launch (<<< >>>), through the ds4_gpu_* functions it calls."""
    seen = set() if seen is None else seen
    if fn in seen:
        return set()
    seen.add(fn)
    body = host_body(src, fn)
    out = set(re.findall(r"\b(\w+)\s*<<<", body))
    for callee in set(re.findall(r"\b(ds4_gpu_\w+_tensor)\s*\(", body)) - {fn}:
        out |= launched_kernels(src, callee, seen)
    return out


def test_the_family_is_the_plan_order_of_the_task(target):
    """Every unit of the family has a spec file and a header declaration."""
    names = {f.name for f in target.api}
    for u in HC_UNITS:
        assert u in names, u
        assert (target.dir / "parity" / f"{u}.py").is_file(), u


@pytest.mark.parametrize("unit", HC_UNITS)
def test_dispatch_lists_every_upstream_kernel_and_real_shapes(target, cuda_src, unit):
    mod = _module(target, unit)
    dispatch = mod.DISPATCH
    assert set(dispatch) == launched_kernels(cuda_src, unit), unit
    labels = {s.label for s in mod.SPEC.shapes}
    knobs = set(re.findall(r"\b(DS4_CUDA_\w+)", host_body(cuda_src, unit)))
    env = getattr(mod, "KNOWN_GOOD_ENV", [])
    assert knobs == {k for setting in env for k in setting}, "every env knob of the host function has a setting"
    for kernel, why in dispatch.items():
        assert "->" in why, (kernel, why)
        named = re.findall(r"shapes? '([^']+)'(?: and '([^']+)')?", why)
        named = {n for pair in named for n in pair if n}
        under_env = re.search(r"KNOWN_GOOD_ENV\[(\d+)\]", why)
        assert named or under_env, f"{kernel}: names no shape and no env setting"
        assert named <= labels, (kernel, named - labels)
        if under_env:
            assert int(under_env.group(1)) < len(env)
            setting = env[int(under_env.group(1))]
            assert any(k in why for k in setting), (kernel, setting)


# ---------------------------------------------------------------------------
# the specs in host mode
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("unit", HC_UNITS)
def test_spec_validates_and_builds_two_seeds(target, unit):
    from porter.gates.parity.gate import prepare
    from porter.spec import Context, Exact, load_spec

    spec = load_spec(target, unit)
    assert spec is not None and spec.unit == unit
    cases = prepare(spec, target.api_function(unit), Context(None), [12345, 67890])
    ok = [c for c in cases if c.shape.expect == "ok"]
    assert ok and any(c.shape.expect == "error" for c in cases)
    timed = [c for c in cases if c.shape.timed]  # one per phase the op serves (decode, the prefill chunk)
    assert timed and all(c.shape.expect == "ok" and spec.bytes_moved(c.shape) > 0 for c in timed)
    from porter.gates.parity.gate import zero_answer_passes

    assert zero_answer_passes(spec, cases) == [], "an all-zero answer passes these cases: calibration refuses the spec"
    for c in ok:
        a, b = (c.calls[p].expect for p in (0, 1))
        assert any(not np.array_equal(a[k], b[k]) for k in a), (unit, c.shape.label)  # seeds give other answers
        for name, tol in spec.outputs.items():
            ref = a[name]
            if isinstance(tol, Exact):
                continue
            finite = ref[np.isfinite(ref)]
            if finite.size and tol.max_abs != 0.0:  # a tolerance relative to a real magnitude
                assert np.sqrt(np.mean(finite.astype(np.float64) ** 2)) > 1e-2, (unit, c.shape.label, name)


def test_real_ds4_sizes_are_in_the_specs(target):
    from porter.spec import load_spec

    dims = {u: [s.dims for s in load_spec(target, u).shapes] for u in HC_UNITS}
    assert any(d.get("n_embd") == 4096 and d.get("n_hc") == 4 for d in dims["ds4_gpu_embed_token_hc_tensor"])
    assert any(d.get("n") == 16384 for d in dims["ds4_gpu_rms_norm_plain_tensor"])
    assert any(d.get("q_n") == 1024 and d.get("kv_n") == 512 for d in dims["ds4_gpu_dsv4_qkv_rms_norm_rows_tensor"])
    assert any(d.get("n_head") == 64 and d.get("head_dim") == 512 for d in dims["ds4_gpu_head_rms_norm_tensor"])
    assert any(d.get("iters") == 20 for d in dims["ds4_gpu_hc_split_sinkhorn_tensor"])
    assert any(d.get("top_k") == 512 for d in dims["ds4_gpu_dsv4_topk_mask_tensor"])
    assert any(d.get("hash_rows") == 129280 for d in dims["ds4_gpu_router_select_tensor"])
    assert any(d.get("layer") == 42 and d.get("width") == 4096
               for d in dims["ds4_gpu_directional_steering_project_tensor"])


# ---------------------------------------------------------------------------
# mutants of the family
# ---------------------------------------------------------------------------

def _family_mutants(target):
    from porter.gates.mutants import rule_mutants

    text = (target.dir / "mutants.toml").read_text()
    assert text.count(FAMILY_HEADER) == 1
    section = text.split(FAMILY_HEADER)[1].split("\n# --- ")[0]  # up to the next family's header
    names = {m["name"] for m in tomllib.loads(section)["mutant"]}
    # the runtime scenarios' mutants were appended inside this section by a merge: the family's own units only
    return [m for m in rule_mutants(target) if m.name in names and m.unit in HC_UNITS]


def test_every_family_mutant_applies_once(target, cuda_src):
    muts = _family_mutants(target)
    for m in muts:
        for r in m.rules:
            assert cuda_src.count(r.search) == 1, (m.name, r.search[:60])
        out = m.apply(cuda_src)
        assert out != cuda_src and "porter mutant" in out


def test_each_unit_has_at_least_two_distinct_mutants(target):
    muts = _family_mutants(target)
    by_unit: dict[str, list] = {}
    for m in muts:
        by_unit.setdefault(m.unit, []).append(m)
    assert set(by_unit) == set(HC_UNITS)
    for unit, ms in by_unit.items():
        assert len(ms) >= 2, unit
        assert len({(r.search, r.replace) for m in ms for r in m.rules}) >= 2, unit  # not one edit twice
        assert len({m.why for m in ms}) == len(ms), unit
