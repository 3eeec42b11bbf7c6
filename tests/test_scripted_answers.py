"""The scripted answers of targets/minimoe are what the harness is tested with.

Checked here without a GPU (nvcc only):
  - manifest.toml is well formed: every unit of mini_gpu.h has exactly one good
    answer and it comes last among that unit's answers; files exist; expect
    values are known gates;
  - every good answer holds exactly one ```cuda block that compiles ALONE with
    the target's nvcc flags (-include mini_cuda.cuh), and glue + all 24 link into
    libmini_cuda.so exporting the 24 API symbols unmangled;
  - every bad answer expected to die at "build" fails to compile, and every bad
    answer meant for a later gate (parity, perf) compiles, so it really reaches
    the gate that must reject it.
Objects are compiled two at a time and cached by sha256 in a per-session dir.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "targets" / "minimoe"
SCRIPTED = TARGET / "scripted"


def _load_builder():
    spec = importlib.util.spec_from_file_location("minimoe_build_scripted", TARGET / "tools" / "build_scripted.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


bs = _load_builder()
UNITS = bs.api_units()
ANSWERS = bs.load_manifest()
GOOD = {a.unit: a for a in ANSWERS if a.expect == "pass"}
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
DRIFT = "bad/matmul_q8_0_missing_ntok.md"  # the signature-drift answer
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found (CUDA toolkit needed to compile the answers)")


def _code(answer) -> str:
    blocks = bs.cuda_blocks(answer.path.read_text())
    assert len(blocks) == 1, f"{answer.file}: {len(blocks)} ```cuda blocks"
    return blocks[0]


def _obj_name(answer) -> str:
    return f"{answer.unit}__{Path(answer.file).stem}"


# ---------------------------------------------------------------- manifest --

def test_header_has_24_units():
    assert len(UNITS) == 24 and len(set(UNITS)) == 24


def test_manifest_well_formed():
    raw = tomllib.loads((SCRIPTED / "manifest.toml").read_text())
    assert set(raw) == {"answer"}, "manifest.toml holds only [[answer]] tables"
    for i, a in enumerate(raw["answer"]):
        assert set(a) == {"unit", "file", "expect", "why"}, f"answer #{i}: keys {sorted(a)}"
        assert all(isinstance(v, str) and v.strip() for v in a.values()), f"answer #{i}: empty value"
    files = [a.file for a in ANSWERS]
    assert len(files) == len(set(files)), "an answer file is listed twice"
    for a in ANSWERS:
        assert a.unit in UNITS, f"{a.file}: unknown unit {a.unit}"
        assert a.expect in bs.EXPECT_VALUES, f"{a.file}: expect={a.expect!r}"
        assert a.path.is_file(), f"missing {a.path}"
        assert a.path.resolve().is_relative_to(SCRIPTED.resolve())
        assert ("good/" if a.expect == "pass" else "bad/") in a.file, f"{a.file}: good answers live in good/, bad in bad/"


def test_every_unit_has_one_good_answer_last():
    for unit in UNITS:
        mine = [a for a in ANSWERS if a.unit == unit]
        goods = [a for a in mine if a.expect == "pass"]
        assert len(goods) == 1, f"{unit}: {len(goods)} good answers"
        assert mine[-1].expect == "pass", f"{unit}: the good answer must come after its bad answers"
    # every file under scripted/ is in the manifest (no orphaned answers)
    on_disk = {str(p.relative_to(SCRIPTED)) for p in SCRIPTED.glob("*/*.md")}
    assert on_disk == {a.file for a in ANSWERS}


def test_bad_answers_cover_the_failure_list():
    bad = [a for a in ANSWERS if a.expect != "pass"]
    assert {a.expect for a in bad} == {"extract", "static", "build", "parity", "perf"}
    assert len({a.unit for a in bad}) >= 6, "bad answers are spread over several units"


# ------------------------------------------------------------ answer shape --

@pytest.mark.parametrize("unit", UNITS)
def test_good_answer_shape(unit):
    a = GOOD[unit]
    text = a.path.read_text()
    assert text.count("```") == 2, f"{a.file}: exactly one fenced block"
    code = _code(a)
    prose = text.split("```", 1)[0].strip()
    assert prose, f"{a.file}: a response starts with a sentence of prose"
    first = next(line for line in code.splitlines() if line.strip())
    assert first.strip() == '#include "mini_cuda.cuh"', f"{a.file}: first line {first!r}"
    assert re.search(r'extern\s+"C"[^;{]*\b' + unit + r"\s*\(", code), f"{a.file}: no extern \"C\" {unit}"
    assert "porter:placeholder" not in code and "TODO" not in code
    # kernels and device helpers are file-local, so units never clash at link time
    for m in re.finditer(r"^[^\n]*\b__global__\b[^\n]*$", code, re.M):
        assert m.group(0).lstrip().startswith("static"), f"{a.file}: non-static kernel: {m.group(0)}"
    for m in re.finditer(r"^(?!\s*static)[^\n#]*\b__(device|constant)__\b[^\n]*$", code, re.M):
        pytest.fail(f"{a.file}: non-static device symbol: {m.group(0)}")


def test_bad_answer_shapes():
    for a in ANSWERS:
        if a.expect in ("pass",):
            continue
        n = len(bs.cuda_blocks(a.path.read_text()))
        if a.expect == "extract":
            assert n != 1, f"{a.file}: an extract-rejected answer must not hold exactly one code block"
        else:
            assert n == 1, f"{a.file}: must reach the {a.expect} gate, so it holds exactly one code block"


def test_iq2_xxs_tables_match_gguf():
    pytest.importorskip("gguf")
    spec = importlib.util.spec_from_file_location("gen_iq2", TARGET / "tools" / "gen_iq2xxs_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    tables = gen.render().strip()
    assert tables in _code(GOOD["mini_gpu_routed_gate_up_iq2_xxs_tensor"]), "IQ2_XXS tables differ from gguf-py"


def test_porter_gates_agree_with_the_manifest():
    """Replay every answer through porter's own extraction and static gate."""
    from porter.gates.extract import ExtractionError, extract_unit_source
    from porter.gates import static
    from porter.gates.driver import Candidate, GateContext
    from porter.target import load_target

    target = load_target(ROOT, "minimoe")
    for a in ANSWERS:
        try:
            src = extract_unit_source(a.path.read_text(), a.unit, target)
        except ExtractionError as exc:
            assert a.expect == "extract", f"{a.file} (expect={a.expect}) rejected by extraction: {exc}"
            continue
        assert a.expect != "extract", f"{a.file} should be rejected by extraction"
        r = static.run(Candidate.of(a.unit, src), GateContext(target))
        if a.expect == "static":
            assert not r.ok, f"{a.file} should be rejected by the static gate"
        else:
            assert r.ok, f"{a.file} (expect={a.expect}) rejected by the static gate: {r.summary}"


# ----------------------------------------------------------------- compile --

@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Compile glue, every good answer and every single-block bad answer once (2 workers)."""
    if not HAS_NVCC:
        pytest.skip("nvcc not found")
    cache = tmp_path_factory.mktemp("nvcc_cache")
    items = list(bs.glue_sources())
    for a in ANSWERS:
        blocks = bs.cuda_blocks(a.path.read_text())
        # goods, and bads whose compile result is asserted below (static stubs compile and need no check)
        if len(blocks) == 1 and (a.expect in ("pass", "build", "parity", "perf") or a.file == DRIFT):
            items.append((_obj_name(a), blocks[0]))
    return bs.compile_many(items, cache, jobs=2)


@needs_nvcc
@pytest.mark.parametrize("unit", UNITS)
def test_good_answer_compiles_alone(compiled, unit):
    r = compiled[_obj_name(GOOD[unit])]
    assert r.ok, f"{GOOD[unit].file} does not compile:\n{r.log}"


@needs_nvcc
def test_glue_compiles(compiled):
    for name, _ in bs.glue_sources():
        assert compiled[name].ok, compiled[name].log


@needs_nvcc
def test_library_links_and_exports_every_unit(compiled, tmp_path):
    objs = [compiled[name].obj for name, _ in bs.glue_sources()]
    objs += [compiled[_obj_name(GOOD[u])].obj for u in UNITS]
    assert all(objs), "some translation unit failed to compile"
    cfg = bs.target_config()["cuda"]
    lib = tmp_path / cfg["library"]
    arch = [f for f in bs.nvcc_flags() if f.startswith(("-arch", "-gencode", "arch="))]
    proc = subprocess.run([bs.nvcc(), *arch, "-o", str(lib), *map(str, objs), *cfg["link_flags"]],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = bs.exported_symbols(lib)
    missing = sorted(set(UNITS) - exported)
    assert not missing, f"not exported (or mangled): {missing}"
    for glue_fn in ("mini_cuda_stream", "mini_cuda_model_ptr", "mini_cuda_forget_models", "mini_cuda_check"):
        assert glue_fn in exported


@needs_nvcc
def test_build_rejected_answers_fail_to_compile(compiled):
    bad = [a for a in ANSWERS if a.expect == "build"]
    assert bad
    for a in bad:
        r = compiled[_obj_name(a)]
        assert not r.ok, f"{a.file} is expected to fail the build gate but compiles"
        assert "error" in r.log.lower()


@needs_nvcc
def test_later_gate_answers_compile(compiled):
    """parity/perf answers must get past the build gate, or they test nothing."""
    for a in ANSWERS:
        if a.expect in ("parity", "perf"):
            r = compiled[_obj_name(a)]
            assert r.ok, f"{a.file} (expect={a.expect}) does not even compile:\n{r.log}"


@needs_nvcc
def test_signature_drift_is_also_a_build_error(compiled):
    """The static gate rejects it first, but the forced mini_cuda.cuh makes it a conflicting declaration too."""
    drift = [a for a in ANSWERS if a.file == DRIFT]
    assert drift and drift[0].expect == "static"
    r = compiled[_obj_name(drift[0])]
    assert not r.ok and "mini_gpu_matmul_q8_0_tensor" in r.log


# ------------------------------------------------- tools/compare_cuda_cpu.py --

def _load_compare():
    spec = importlib.util.spec_from_file_location("minimoe_compare_cuda_cpu", TARGET / "tools" / "compare_cuda_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fixture_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    out = tmp_path_factory.mktemp("fixture") / "minimoe.gguf"
    subprocess.run([sys.executable, str(TARGET / "make_fixture.py"), str(out)], check=True, capture_output=True)
    return out


def test_compare_tool_reads_gguf_like_gguf_py(fixture_gguf):
    import gguf

    cmp = _load_compare()
    mine = cmp.read_gguf(fixture_gguf)
    reader = gguf.GGUFReader(fixture_gguf)
    assert len(mine.tensors) == len(reader.tensors)
    for t in reader.tensors:
        m = mine.tensors[t.name]
        assert m.offset == t.data_offset, t.name
        assert m.ne == tuple(int(x) for x in t.shape), t.name
        assert m.type == t.tensor_type.name, t.name
    assert int(mine.meta["minimoe.embedding_length"]) == 256


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_compare_tool_cases_run_on_the_cpu_backend(fixture_gguf, tmp_path):
    """Every comparison case is well formed: the CPU backend accepts it (or rejects the error cases)."""
    cmp = _load_compare()
    cpu = cmp.Backend("cpu", cmp.build_cpu_lib(tmp_path))
    cpu.init()
    cases, keep = cmp.build_cases(cmp.read_gguf(fixture_gguf), seed=7)
    assert {c.op for c in cases} == set(cmp.TOL) and len(cmp.TOL) == 14
    assert {f"mini_gpu_{op}_tensor" for op in cmp.TOL} == set(UNITS) - set(bs.target_config()["units"]["runtime"])
    bad = [(c.fn, c.label, rc) for c, rc, ok in cmp.run_cpu_plan(cpu, cases) if not ok]
    assert not bad, bad
    del keep
