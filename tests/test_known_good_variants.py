"""Known-good variants (porter/calibration/variants.py): the file, and which ops read which knobs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import NO_DS4, ds4_checkout
from porter.calibration.variants import FILE, Variant, VariantPlan, load_variants
from porter.errors import PorterError

REPO = Path(__file__).resolve().parents[1]
needs_ds4 = pytest.mark.skipif(ds4_checkout() is None, reason=NO_DS4)


class _T:
    def __init__(self, d):
        self.dir = d


def test_no_file_means_no_variants(tmp_path):
    assert load_variants(_T(tmp_path)) == []


@pytest.mark.parametrize("body,msg", [
    ('[[variant]]\nname = "a"\n', "needs a name and a non-empty env"),
    ('[[variant]]\nname = "a"\nenv = {}\n', "needs a name and a non-empty env"),
    ('[[variant]]\nname = "a"\nenv = { K = 1 }\n', "env values must be strings"),
    ('[[variant]]\nname = "a"\nenv = { K = "1" }\n[[variant]]\nname = "a"\nenv = { J = "1" }\n', "two variants"),
    ('[[variant]\n', FILE),
])
def test_a_malformed_variants_file_is_a_one_line_error(tmp_path, body, msg):
    (tmp_path / FILE).write_text(body)
    with pytest.raises(PorterError, match=re.escape(msg)) as exc:
        load_variants(_T(tmp_path))
    assert "\n" not in str(exc.value)


@pytest.fixture(scope="module")
def ds4():
    from porter.target import load_target

    return load_target(REPO, "ds4", ds4_checkout())


@needs_ds4
def test_a_variant_runs_only_for_ops_whose_path_reads_one_of_its_knobs(ds4):
    plan = VariantPlan(ds4, [Variant("router", "", {"DS4_CUDA_NO_WARP_ROUTER_SELECT": "1"}),
                             Variant("moe", "", {"DS4_CUDA_MOE_NO_EXPERT_TILES": "1"})])
    file_variants = lambda unit: [v.name for v in plan.for_unit(unit) if not v.name.startswith("spec-env")]  # noqa: E731
    assert file_variants("ds4_gpu_router_select_tensor") == ["router"]
    assert file_variants("ds4_gpu_routed_moe_batch_tensor") == ["moe"]
    assert plan.for_unit("ds4_gpu_rms_norm_plain_tensor") == []
    # knobs read by an API function the op calls count too (shared_gate_up calls the swiglu op)
    assert plan.knobs("ds4_gpu_swiglu_tensor") <= plan.knobs("ds4_gpu_shared_gate_up_swiglu_q8_0_tensor")


@needs_ds4
def test_every_declared_variant_names_knobs_upstream_reads_and_applies_somewhere(ds4):
    """A misspelt knob would make a variant that silently runs the default path."""
    from porter.spec import load_specs

    variants = load_variants(ds4)
    if not variants:
        pytest.skip(f"targets/ds4/{FILE} declares no variants")
    source = (Path(ds4.checkout) / "ds4_cuda.cu").read_text()
    read = set(re.findall(r'getenv\s*\(\s*"([A-Z0-9_]+)"', source))
    for v in variants:
        assert set(v.env) <= read, f"{v.name}: {sorted(set(v.env) - read)} never read by ds4_cuda.cu"
    from porter.spec import spec_known_good_env

    for u in load_specs(ds4):
        for env in spec_known_good_env(ds4, u):
            assert set(env) <= read, f"{u} KNOWN_GOOD_ENV: {sorted(set(env) - read)} never read by ds4_cuda.cu"
    plan = VariantPlan(ds4, variants)
    specs = load_specs(ds4)
    used = {v.name for u in specs for v in plan.for_unit(u) if not v.name.startswith("spec-env")}
    assert used == {v.name for v in variants}, f"variants no spec's op reads: {sorted({v.name for v in variants} - used)}"


@needs_ds4
def test_a_spec_files_own_knob_settings_run_too_once_each(ds4):
    """KNOWN_GOOD_ENV beside a spec's DISPATCH table is executed, not documentation: each setting
    no target variant already makes exactly is one more variant of that op."""
    from porter.spec import spec_known_good_env

    mine = spec_known_good_env(ds4, "ds4_gpu_router_select_tensor")
    assert {"DS4_CUDA_NO_WARP_ROUTER_SELECT": "1"} in mine and len(mine) == 2
    plan = VariantPlan(ds4, [Variant("router", "", {"DS4_CUDA_NO_WARP_ROUTER_SELECT": "1"})])
    got = plan.for_unit("ds4_gpu_router_select_tensor")
    assert [v.name for v in got] == ["router", "spec-env-1"]
    assert got[1].env == mine[1] and got[1].env != got[0].env
