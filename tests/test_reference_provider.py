"""The reference provider: upstream's own code per unit, sliced by tree-sitter and adapted by declared rules.

CI part (no ds4 checkout): tests/data/reference_mini is a small self-made
backend with shared helpers, an API->API call, a non-API extern "C" helper, a
non-static __constant__ table in a quoted include, file-scope state and an
unused helper.  Each unit's slice is checked for what it must hold and what it
must not, the rules are shown to apply (and to be enforced: unrenamed state
and rules naming nothing are refused), and the slices compile and link into
the backend with `-z defs` through porter's own build gate.

ds4 part (skipped without the checkout, PORTER_DS4_SOURCE or external/ds4):
every one of ds4's units is sliced, extracted and put through the static gate;
with PORTER_DS4_SLICE_COMPILE=1 each slice is also compiled in its own
translation unit against targets/ds4/cuda/ds4_cuda.cuh (a few at a time: this
takes long on a small machine) and all of them are linked with the glue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from porter.target.cparse import function_definitions
from porter.gates.extract import extract_unit_source
from porter.providers import get_provider
from porter.providers.base import PromptRequest, ProviderError
from porter.target import load_target

from conftest import NO_DS4, needs_nvcc
from porter.gates.driver import Candidate, GateContext

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "tests" / "data" / "reference_mini"


def _mini_target(tmp_path: Path, rules: str | None = None):
    ws = tmp_path / "ws"
    shutil.copytree(MINI / "target", ws / "targets" / "refmini")
    if rules is not None:
        (ws / "targets" / "refmini" / "reference_rules.toml").write_text(rules)
    return load_target(ws, "refmini", MINI / "checkout")


def _answer(provider, unit: str, attempt: int = 1) -> str:
    req = PromptRequest(target="refmini", unit=unit, attempt=attempt, system="", prompt="")
    return provider.complete(req).text


def _slices(target, **options) -> dict[str, str]:
    p = get_provider("reference", target, options)
    return {u: extract_unit_source(_answer(p, u), u, target) for u in target.units}


def _defined(src: str) -> set[str]:
    return {d.name for d in function_definitions(src)}


def test_each_slice_holds_what_its_unit_reaches_and_nothing_else(tmp_path):
    t = _mini_target(tmp_path)
    s = _slices(t)

    # shared device helper reached through a kernel; the unused helper that calls it is not
    assert {"refmini_gpu_sum_tensor", "sum_kernel", "warp_sum_f32"} <= _defined(s["refmini_gpu_sum_tensor"])
    for absent in ("unused_helper_dev", "REFMINI_UNUSED", "scale_kernel", "lookup_kernel", "refmini_table",
                   "REFMINI_BLOCK"):
        assert absent not in s["refmini_gpu_sum_tensor"], absent
    assert _defined(s["refmini_gpu_scale_tensor"]) == {"refmini_gpu_scale_tensor", "scale_kernel"}
    assert "#define REFMINI_BLOCK 256" in s["refmini_gpu_scale_tensor"]

    # API -> API stays a call (resolved at link time); the non-API extern "C" helper becomes static
    twice = s["refmini_gpu_scale_twice_tensor"]
    assert "refmini_gpu_scale_tensor(out, x, n, s)" in twice
    assert "refmini_gpu_scale_tensor" not in _defined(twice)
    assert "static int refmini_gpu_scale_pair(" in twice
    assert 'extern "C" int refmini_gpu_scale_pair' not in twice
    assert _defined(twice) == {"refmini_gpu_scale_twice_tensor", "refmini_gpu_scale_pair", "scale_kernel"}

    # the __constant__ table: inlined from its include, made static, only where it is read
    look = s["refmini_gpu_lookup_tensor"]
    assert "static __device__ __constant__ float refmini_table[16]" in look
    assert "refmini_tables.inc" not in look
    assert all("refmini_table" not in s[u] for u in t.units if u != "refmini_gpu_lookup_tensor")


def test_rules_rename_state_and_drop_what_the_conventions_provide(tmp_path):
    t = _mini_target(tmp_path)
    for unit, src in _slices(t).items():
        assert "g_launches" not in src and "g_last_input" not in src, unit
        assert "static int cuda_ok" not in src and "cuda_ok(" not in src, unit
        assert "struct refmini_gpu_tensor {" not in src, unit  # provided by the conventions header
        assert src.startswith("// refmini_gpu_") and '#include "refmini_cuda.cuh"' in src, unit
    scale = _slices(t)["refmini_gpu_scale_tensor"]
    assert "refmini_launches++" in scale and "refmini_last_input = " in scale
    assert 'return refmini_ok(cudaGetLastError(), "scale")' in scale


def test_mutable_state_left_unrenamed_is_refused(tmp_path):
    rules = (MINI / "target" / "reference_rules.toml").read_text().replace('g_last_input = "refmini_last_input"\n', "")
    t = _mini_target(tmp_path, rules)
    p = get_provider("reference", t, {})
    with pytest.raises(ProviderError, match=r"refmini_gpu_scale_tensor reaches file-scope state g_last_input"):
        _answer(p, "refmini_gpu_scale_tensor")
    # a unit that never touches that state is still answered
    assert "sum_kernel" in _answer(p, "refmini_gpu_sum_tensor")


def test_per_unit_allows_a_private_copy_only_when_declared(tmp_path):
    rules = (MINI / "target" / "reference_rules.toml").read_text() \
        .replace('g_launches = "refmini_launches"\n', "").replace("per_unit = []", 'per_unit = ["g_launches"]')
    t = _mini_target(tmp_path, rules)
    src = _slices(t)["refmini_gpu_sum_tensor"]
    assert "static int g_launches;" in src


def test_rules_must_name_what_the_conventions_header_declares(tmp_path):
    rules = (MINI / "target" / "reference_rules.toml").read_text().replace('"refmini_ok"', '"refmini_check"')
    t = _mini_target(tmp_path, rules)
    with pytest.raises(ProviderError, match="refmini_check, which refmini_cuda.cuh does not declare"):
        get_provider("reference", t, {})


def test_flaws_answer_the_units_mutants_first_then_the_real_slice(tmp_path):
    t = _mini_target(tmp_path)
    real = "for (int o = 16; o > 0; o >>= 1)"
    mutant = "for (int o = 16; o > 1; o >>= 1)"
    plain = get_provider("reference", t, {})
    assert real in _answer(plain, "refmini_gpu_sum_tensor", 1)
    flawed = get_provider("reference", t, {"flaws": True})
    first, second = _answer(flawed, "refmini_gpu_sum_tensor", 1), _answer(flawed, "refmini_gpu_sum_tensor", 2)
    assert mutant in first and real not in first and "mutant sum-drops-last-lane" in first
    assert real in second and mutant not in second
    # a unit without mutants gets the real slice at once
    assert "mutant" not in _answer(flawed, "refmini_gpu_scale_tensor", 1)
    c = flawed.complete(PromptRequest("refmini", "refmini_gpu_sum_tensor", 1, "", ""))
    assert c.provider == "reference" and c.model.endswith(":sum-drops-last-lane")


def test_missing_trailing_header_params_are_appended_only_by_the_declared_rule(tmp_path):
    header = MINI / "checkout" / "refmini_gpu.h"
    checkout = tmp_path / "checkout"
    shutil.copytree(MINI / "checkout", checkout)
    # the header grows a trailing out-parameter the upstream backend never had
    (checkout / header.name).write_text(header.read_text().replace(
        "int refmini_gpu_sum_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n);",
        "int refmini_gpu_sum_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n, int *used_warp);"))
    from porter.gates import static

    for flag, ok in ((False, False), (True, True)):
        t = _mini_target(tmp_path / str(flag))
        rules = t.dir / "reference_rules.toml"
        rules.write_text(f"append_missing_params = {str(flag).lower()}\n" + rules.read_text())
        t = load_target(t.workspace, "refmini", checkout)
        src = extract_unit_source(_answer(get_provider("reference", t, {}), "refmini_gpu_sum_tensor"),
                                  "refmini_gpu_sum_tensor", t)
        assert ("uint32_t n, int *used_warp) {" in src) == ok
        assert static.run(Candidate.of("refmini_gpu_sum_tensor", src), GateContext(t)).ok == ok


def test_a_trivial_runtime_body_passes_the_static_gate_only_when_declared(tmp_path):
    from porter.gates import static

    src = '#include "refmini_cuda.cuh"\nextern "C" int refmini_gpu_init(void) {\n    return 1;\n}\n'
    t = _mini_target(tmp_path)
    assert not static.run(Candidate.of("refmini_gpu_init", src), GateContext(t)).ok
    toml = t.dir / "target.toml"
    toml.write_text(toml.read_text().replace('runtime = ["refmini_gpu_init"]',
                                             'runtime = ["refmini_gpu_init"]\ntrivial = ["refmini_gpu_init"]'))
    t = load_target(t.workspace, "refmini", MINI / "checkout")
    assert static.run(Candidate.of("refmini_gpu_init", src), GateContext(t)).ok
    # an op unit cannot be declared trivial into passing
    toml.write_text(toml.read_text().replace('trivial = ["refmini_gpu_init"]', 'trivial = ["refmini_gpu_init", "refmini_gpu_sum_tensor"]'))
    t = load_target(t.workspace, "refmini", MINI / "checkout")
    op = '#include "refmini_cuda.cuh"\nextern "C" int refmini_gpu_sum_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n) {\n    return 1;\n}\n'
    assert not static.run(Candidate.of("refmini_gpu_sum_tensor", op), GateContext(t)).ok


def test_a_mutant_outside_the_units_slice_is_refused_not_answered_unmutated(tmp_path):
    t = _mini_target(tmp_path)
    (t.dir / "mutants.toml").write_text((MINI / "target" / "mutants.toml").read_text().replace(
        'unit = "refmini_gpu_sum_tensor"', 'unit = "refmini_gpu_scale_tensor"'))
    p = get_provider("reference", t, {"flaws": True})
    with pytest.raises(ProviderError, match="changes nothing in refmini_gpu_scale_tensor's slice"):
        _answer(p, "refmini_gpu_scale_tensor", 1)
    assert "mutant" not in _answer(p, "refmini_gpu_scale_tensor", 2)


def test_unknown_unit_and_missing_source_are_one_line_errors(tmp_path):
    t = _mini_target(tmp_path)
    p = get_provider("reference", t, {})
    with pytest.raises(ProviderError, match="defines no function refmini_gpu_nope"):
        _answer(p, "refmini_gpu_nope")
    toml = t.dir / "target.toml"
    toml.write_text(toml.read_text().replace('source = "refmini_cuda.cu"', 'source = "gone.cu"'))
    t2 = load_target(t.workspace, "refmini", MINI / "checkout")
    with pytest.raises(ProviderError, match="gone.cu does not exist"):
        get_provider("reference", t2, {})


@needs_nvcc
def test_slices_compile_alone_and_link_through_the_build_gate(tmp_path, build_cache):
    from porter.gates import build

    t = _mini_target(tmp_path)
    slices = _slices(t)
    t.ported_dir.mkdir(parents=True)
    for u, src in slices.items():
        if u != "refmini_gpu_scale_tensor":
            t.unit_path(u).write_text(src)
    # scale_tensor as a placeholder: scale_twice's call to it must still resolve (the placeholder defines it)
    res = build.run(Candidate.of("refmini_gpu_sum_tensor", slices["refmini_gpu_sum_tensor"]), GateContext(t, build_cache=build_cache))
    assert res.ok, res.diagnostics
    assert res.evidence["linked"]["refmini_gpu_scale_tensor"]["placeholder"] is True
    # with every unit sliced: each compiled in its own TU, linked with -z defs, the static tables do not clash
    t.unit_path("refmini_gpu_scale_tensor").write_text(slices["refmini_gpu_scale_tensor"])
    ctx = GateContext(t, build_cache=build_cache)
    res = build.run(Candidate.of("refmini_gpu_lookup_tensor", slices["refmini_gpu_lookup_tensor"]), ctx)
    assert res.ok, res.diagnostics
    # the unit's own library holds what it calls; the whole backend (what the engine loads) holds them all
    assert ctx.whole_backend().is_file()


@needs_nvcc
@pytest.mark.parametrize("storage", ["static", ""])
def test_the_static_table_rule_keeps_two_units_linkable_with_device_linking(tmp_path, storage):
    """porter's build is whole-program (no -rdc): nvcc gives a __constant__ variable an internal host
    shadow, so even non-static tables link there.  With relocatable device code (-rdc, the device link
    of several units) two non-static definitions clash; the `static` rule keeps slices valid there too."""
    rules = (MINI / "target" / "reference_rules.toml").read_text().replace(
        '"refmini_tables.inc" = "static"', f'"refmini_tables.inc" = "{storage}"')
    t = _mini_target(tmp_path, rules)
    look = _slices(t)["refmini_gpu_lookup_tensor"]
    assert ("static __device__ __constant__" in look) == bool(storage)
    objs = []
    for i in range(2):  # the table in two translation units, as in two units that read it
        cu = tmp_path / f"u{i}.cu"
        cu.write_text(look.replace("refmini_gpu_lookup_tensor", f"refmini_gpu_lookup_tensor_{i}").replace(
            "lookup_kernel", f"lookup_kernel_{i}"))
        subprocess.run(["nvcc", "-c", "-rdc=true", "-arch=sm_90", "-std=c++17", "-I", str(t.api_header.parent),
                        "-I", str(t.cuda_dir), "-o", str(tmp_path / f"u{i}.o"), str(cu)], check=True,
                       capture_output=True, text=True)
        objs.append(str(tmp_path / f"u{i}.o"))
    r = subprocess.run(["nvcc", "-dlink", "-arch=sm_90", "-o", str(tmp_path / "dlink.o"), *objs],
                       capture_output=True, text=True)
    if storage:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and "refmini_table" in r.stderr, r.stderr


# ---------------------------------------------------------------- ds4, with the user's checkout


from conftest import ds4_checkout as _ds4_checkout  # noqa: E402

needs_ds4 = pytest.mark.skipif(_ds4_checkout() is None,
                               reason=NO_DS4 + " (the ds4 slices need upstream's ds4_cuda.cu)")

# ds4_cuda.cu's ds4_gpu_routed_moe_batch_tensor has 25 parameters where ds4_gpu.h
# (and ds4_metal.m) have 26 (`bool *mid_is_f16`): upstream's own signature drift,
# adapted by the append_missing_params rule.
DS4_UPSTREAM_DRIFT = {"ds4_gpu_routed_moe_batch_tensor": ["mid_is_f16"]}


@needs_ds4
def test_every_ds4_unit_slices_extracts_and_passes_the_static_gate(tmp_path):
    from porter.gates import static

    t = load_target(REPO, "ds4", _ds4_checkout())
    p = get_provider("reference", t, {})
    failed = {}
    for u in t.units:
        src = extract_unit_source(_answer(p, u), u, t)
        assert "g_model_" not in src and "g_cublas" not in src, u
        assert "ds4_iq2_tables_cuda.inc" not in src, u
        r = static.run(Candidate.of(u, src), GateContext(t))
        if not r.ok:
            failed[u] = r.summary
        if u in DS4_UPSTREAM_DRIFT:
            assert all(f"(void){n};" in src for n in DS4_UPSTREAM_DRIFT[u]), u
    assert failed == {}, failed
    assert len(t.units) == 81


def _cublas_include() -> str | None:
    """A folder with cublas_v2.h: the toolkit's own, $CPATH, or the nvidia-cublas wheel's."""
    nvcc = shutil.which("nvcc")
    cands = []
    if nvcc:
        root = Path(os.path.realpath(nvcc)).parents[1]
        cands += [root / "include", *root.glob("targets/*/include")]
    cands += [Path(p) for p in os.environ.get("CPATH", "").split(":") if p]
    try:
        import nvidia  # the pip wheels' namespace package

        for base in nvidia.__path__:
            cands += list(Path(base).glob("*/include"))
    except ImportError:
        pass
    return next((str(c) for c in cands if (c / "cublas_v2.h").is_file()), None)


@needs_ds4
@needs_nvcc
@pytest.mark.skipif(os.environ.get("PORTER_DS4_SLICE_COMPILE") != "1",
                    reason="compiling all ds4 slices takes long: set PORTER_DS4_SLICE_COMPILE=1")
@pytest.mark.skipif(_cublas_include() is None, reason="cublas_v2.h not found (toolkit, CPATH or pip nvidia-cublas)")
def test_every_ds4_slice_compiles_in_its_own_unit_and_links(tmp_path):
    t = load_target(REPO, "ds4", _ds4_checkout())
    p = get_provider("reference", t, {})
    inc = _cublas_include()
    flags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-arch=compute_90", "-I", str(t.api_header.parent),
             "-I", str(t.cuda_dir), "-I", inc, "-include", str(t.conventions_header)]
    jobs = [(u, extract_unit_source(_answer(p, u), u, t)) for u in t.units]
    jobs.append(("glue", t.glue_sources[0].read_text()))

    def one(job):
        name, src = job
        cu, obj = tmp_path / f"{name}.cu", tmp_path / f"{name}.o"
        cu.write_text(src)
        r = subprocess.run(["nvcc", "-c", *flags, "-o", str(obj), str(cu)], capture_output=True, text=True)
        return name, r.returncode, (r.stdout + r.stderr)[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, jobs))
    bad = {n: out for n, rc, out in results if rc != 0}
    assert not bad, f"{len(bad)} of {len(jobs)} do not compile: {sorted(bad)}\n{next(iter(bad.values()), '')}"
    libs = [a for d in ("lib64", "lib") if (Path(inc).parent / d).is_dir() for a in ("-L", str(Path(inc).parent / d))]
    link = subprocess.run(["nvcc", "-shared", "-Xlinker", "-z", "-Xlinker", "defs", "-o", str(tmp_path / "lib.so"),
                           *[str(tmp_path / f"{n}.o") for n, _, _ in results], *libs, "-lcudart", "-lcublas"],
                          capture_output=True, text=True)
    assert link.returncode == 0, (link.stdout + link.stderr)[-3000:]
