"""The kernel-launch trace (porter.calibration.trace): what can be shown without a GPU.

The trace itself runs on a GPU (`python -m porter.calibration.trace`); here: the
interposer builds, a library linked with the shared CUDA runtime really calls
cudaLaunchKernel through the dynamic linker (so a preloaded definition sees every
launch), mangled names map back to kernel identifiers, and the reachable set of
ds4 ops holds the kernels each op's dispatch can choose.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import NO_DS4, ds4_checkout as _ds4_checkout, needs_nvcc
from porter.calibration import trace

REPO = Path(__file__).resolve().parents[1]


def _symbols(which: str, lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", which, str(lib)], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


needs_ds4 = pytest.mark.skipif(_ds4_checkout() is None,
                               reason=NO_DS4)


@pytest.mark.parametrize("mangled,name", [
    ("_ZL16rope_tail_kernelPfjjjjjjjiffffff", "rope_tail_kernel"),
    ("_Z11fill_kernelPfmf", "fill_kernel"),
    ("_ZL44attention_indexed_mixed_heads8_online_kernelILj8ELj16EEvPfPKf", "attention_indexed_mixed_heads8_online_kernel"),
    ("plain_c_kernel", "plain_c_kernel"),
])
def test_mangled_names_map_to_kernel_identifiers(mangled, name):
    assert trace.kernel_name(mangled) == name


def test_a_trace_file_reads_as_a_set_of_kernels(tmp_path):
    p = tmp_path / "t.trace"
    p.write_text("_ZL3fooPf\n_ZL3fooPf\n_Z3barILj8EEvPf\n\n")
    assert trace.read_trace(p) == {"foo", "bar"}
    assert trace.read_trace(tmp_path / "absent") == set()


@needs_nvcc
def test_the_interposer_builds_and_defines_cudaLaunchKernel(tmp_path):
    lib = trace.build_interposer(tmp_path)
    syms = _symbols("--defined-only", lib)
    assert {"cudaLaunchKernel", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz"} <= syms


@needs_nvcc
def test_a_shared_runtime_library_launches_through_the_dynamic_linker(tmp_path):
    """The precondition of the trace: with -cudart shared, <<<>>> becomes a call into libcudart that
    LD_PRELOAD can interpose (nvcc 13: __cudaLaunchKernel; the first interposer hooked only
    cudaLaunchKernel and traced nothing on an H100); with the default static runtime it would not."""
    (tmp_path / "k.cu").write_text(
        '__global__ static void k(float *x) { x[threadIdx.x] = 1.0f; }\n'
        'extern "C" int go(float *x) { k<<<1, 32>>>(x); return cudaGetLastError() == cudaSuccess; }\n')

    def undefined(*flags):
        lib = tmp_path / f"lib{len(flags)}.so"
        subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O3", *flags, "-o", str(lib),
                        str(tmp_path / "k.cu")], check=True, capture_output=True)
        return _symbols("--undefined-only", lib)

    hooked = set(trace.LAUNCH_ENTRY_POINTS)
    assert undefined("-cudart", "shared") & hooked
    assert not undefined() & hooked


@needs_ds4
def test_reachable_kernels_follow_dispatch_and_api_calls():
    from porter.providers.reference import load_rules, reference_source
    from porter.target.scan.cuda_slice import CudaFile
    from porter.target import load_target

    t = load_target(REPO, "ds4", _ds4_checkout())
    rules = load_rules(t)
    cf = CudaFile.parse(reference_source(t), rules)
    attn = trace.reachable_kernels(cf, "ds4_gpu_attention_decode_heads_tensor", rules)
    # both sides of the 7936-row switch the spec's DISPATCH table names
    assert {"attention_decode_mixed_kernel", "attention_decode_mixed_heads8_online_kernel"} <= attn
    # an op calling another API function can launch that function's kernels too
    swiglu = trace.reachable_kernels(cf, "ds4_gpu_swiglu_tensor", rules)
    assert swiglu and swiglu <= trace.reachable_kernels(cf, "ds4_gpu_shared_gate_up_swiglu_q8_0_tensor", rules)
    assert trace.reachable_kernels(cf, "ds4_gpu_tensor_bytes", rules) == set()  # launches nothing


@needs_ds4
def test_every_kernel_a_spec_declares_unreachable_is_one_its_op_can_name():
    """UNREACHABLE tables move kernels out of the trace's 'missing' column; a misspelt or foreign
    name would hide nothing real, and a claim about a kernel outside the op's slice is meaningless."""
    from porter.spec import load_specs, spec_unreachable
    from porter.providers.reference import load_rules, reference_source
    from porter.target.scan.cuda_slice import CudaFile
    from porter.target import load_target

    t = load_target(REPO, "ds4", _ds4_checkout())
    rules = load_rules(t)
    cf = CudaFile.parse(reference_source(t), rules)
    declared = {u: spec_unreachable(t, u) for u in load_specs(t)}
    assert sum(map(len, declared.values())) >= 30  # the one-token ops' batch-only kernels, at least
    for unit, table in declared.items():
        if table:
            reachable = trace.reachable_kernels(cf, unit, rules)
            assert set(table) <= reachable, f"{unit}: {sorted(set(table) - reachable)} not in its slice"


def test_a_trace_row_keeps_declared_unreachable_apart_and_flags_a_wrong_claim():
    row = trace.trace_row("op", {"a", "b", "c", "d"}, {"a", "d", "x"}, {"b": "batch only", "d": "never"},
                          {"v1": {"known_good_ok": True, "adds": []}}, True, "ok")
    assert row["reached"] == ["a", "d"] and row["missing"] == ["c"]
    assert row["declared_unreachable"] == {"b": "batch only"}
    assert row["contradicted"] == ["d"]  # declared unreachable, yet a case launched it
    assert row["outside_slice"] == ["x"] and row["known_good_ok"]
    bad = trace.trace_row("op", {"a"}, {"a"}, {}, {"v1": {"known_good_ok": False, "adds": []}}, True, "ok")
    assert not bad["known_good_ok"]  # a refused variant is a refused known-good


def test_the_trace_starts_the_ops_with_the_most_variants_first(monkeypatch, tmp_path):
    """`porter dev trace --executor ray`: one command over the cluster's slots, longest first (each
    variant is a traced run), rows in the units' order."""
    from types import SimpleNamespace

    import porter.calibration.calibrator as calibrator
    import porter.calibration.libraries as libraries
    import porter.calibration.trace as trace
    import porter.calibration.variants as variants
    import porter.spec as spec
    import porter.providers.reference as reference
    import porter.target.scan.cuda_slice as cuda_slice

    n_variants = {"op_a": 0, "op_b": 3, "op_c": 1}
    ran = []

    class Plan:
        def __init__(self, target, cf=None, rules=None):
            pass

        def for_unit(self, unit):
            return [SimpleNamespace(name=f"v{i}", env={"K": str(i)}) for i in range(n_variants[unit])]

    def parity(target, unit, lib, opts, env=None, seeds=None):
        ran.append(unit)
        return SimpleNamespace(ok=True, summary="ok")

    monkeypatch.setattr(reference, "load_rules", lambda target: None)
    monkeypatch.setattr(reference, "reference_source", lambda target: "")
    monkeypatch.setattr(cuda_slice.CudaFile, "parse", staticmethod(lambda text, rules: None))
    monkeypatch.setattr(trace, "build_interposer", lambda d: d / "interposer.so")
    monkeypatch.setattr(libraries, "build_upstream", lambda target, out_dir, extra_flags: tmp_path / "lib.so")
    monkeypatch.setattr(variants, "VariantPlan", Plan)
    monkeypatch.setattr(calibrator, "parity_on_library", parity)
    monkeypatch.setattr(trace, "reachable_kernels", lambda cf, unit, rules: set())
    monkeypatch.setattr(spec, "spec_unreachable", lambda target, unit: {})
    for var in ("PORTER_PARITY_EXECUTOR", "LD_PRELOAD", trace.TRACE_ENV, "PORTER_PARITY_KEEP"):
        monkeypatch.setenv(var, "")  # trace_units sets them: put back after the test
    rows = trace.trace_units(SimpleNamespace(name="t"), ["op_a", "op_b", "op_c"], tmp_path, out=lambda *a: None,
                             parallel=1)
    assert [u for i, u in enumerate(ran) if i == 0 or ran[i - 1] != u] == ["op_b", "op_c", "op_a"]
    assert [r["unit"] for r in rows] == ["op_a", "op_b", "op_c"]
