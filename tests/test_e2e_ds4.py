"""ds4 reduced e2e without a GPU: the synthetic GGUF's tensor list against ds4.c's own
expectations, a tiny write, the scratch build's patch rules, commands, the accessor's
record format, the calibration variants' rules, and the logprob-vector driver's build.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_DS4

from porter.errors import PorterError
from porter.target.code import load_file

ROOT = Path(__file__).resolve().parents[1]
# ds4's e2e driver and its helpers, as the gate loads them (targets/ds4/target.toml [e2e] driver)
d4 = load_file(ROOT / "targets" / "ds4" / "e2e" / "driver.py")
gg = load_file(ROOT / "targets" / "ds4" / "e2e" / "gguf.py")
lp = load_file(ROOT / "targets" / "ds4" / "e2e" / "logprob.py")


def _checkout() -> Path:
    src = Path(os.environ.get("PORTER_DS4_SOURCE", ROOT / "external" / "ds4"))
    if not (src / "ds4.c").is_file():
        pytest.skip(NO_DS4)
    return src


@pytest.fixture(scope="module")
def ds4_c() -> str:
    return (_checkout() / "ds4.c").read_text()


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(ROOT, "ds4", _checkout())


# ---- the tensor list against ds4.c --------------------------------------------

def _enum(ds4_c: str) -> dict[str, int]:
    body = re.search(r"enum \{\s*(DS4_N_LAYER.*?)\};", ds4_c, re.S).group(1)
    return {k: int(v) for k, v in re.findall(r"(DS4_\w+)\s*=\s*(\d+)", body)}


def _c_expr(expr: str) -> str:
    expr = re.sub(r"\(u?int\d+_t\)", "", expr)
    expr = re.sub(r"(\d+)u\b", r"\1", expr)
    return expr.replace("/", "//")


def _expected_layouts(ds4_c: str, il: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (type or 'ROUTED', dims) from weights_bind and weights_validate_layout, for layer il."""
    env: dict = dict(_enum(ds4_c))
    ratio = 0 if il < 2 else (4 if il % 2 == 0 else 128)
    env.update(ratio=ratio, il=il)
    bind = re.search(r"static void weights_bind\(.*?\n\}\n", ds4_c, re.S).group(0)
    field_name = {}
    for fld, fmt in re.findall(r"(?:l|w)->(\w+)\s*=\s*(?:required_tensorf|tensor_by_namef|required_tensor)\(m, \"([^\"]+)\"", bind):
        field_name[fld] = fmt.replace("%u", str(il))
    body = re.search(r"static void weights_validate_layout\(.*?\n\}\n", ds4_c, re.S).group(0)
    out, stack = {}, []
    for line in body.splitlines()[1:]:
        s = line.strip()
        if m := re.match(r"const \w+ (\w+) = (.*);", s):
            e = m.group(2)
            if "?" in e:
                c, a, b = re.match(r"(.*)\?(.*):(.*)", e).groups()
                e = f"(({_c_expr(a)}) if ({_c_expr(c)}) else ({_c_expr(b)}))"
            elif "ds4_layer_compress_ratio" in e:
                continue
            env[m.group(1)] = eval(_c_expr(e), {}, env)
            continue
        if m := re.match(r"if \((.*)\) \{$", s):
            stack.append(m.group(1))
            continue
        if s == "}":
            if stack:
                stack.pop()
            continue
        if not all(eval(_c_expr(c), {}, env) for c in stack if "->" not in c):
            continue
        if m := re.match(r"tensor_expect_(layout|optional|routed_expert)\((?:l|w)->(\w+),\s*(.*)\);", s):
            kind, fld, args = m.groups()
            parts = [p.strip() for p in args.split(",")]
            if kind == "routed_expert":
                ttype, nd, dims = "ROUTED", int(parts[0]), parts[1:]
            else:
                ttype, nd, dims = parts[0].replace("DS4_TENSOR_", ""), int(parts[1]), parts[2:]
            out[field_name[fld]] = (ttype, tuple(eval(_c_expr(x), {}, env) for x in dims[:nd]))
    return out


def test_synthetic_tensors_are_exactly_what_ds4_validates(ds4_c):
    specs = {s.name: s for s in gg.tensor_specs(5)}
    assert _enum(ds4_c) == {f"DS4_{k}": v for k, v in gg.DS4_DIMS.items()} | {"DS4_N_LAYER": 43}
    want: dict = {}
    for il in range(5):
        want.update(_expected_layouts(ds4_c, il))
    assert set(specs) == set(want), (set(specs) ^ set(want))
    for name, (ttype, dims) in want.items():
        s = specs[name]
        assert s.ne == dims, (name, s.ne, dims)
        if ttype == "ROUTED":
            assert s.type == ("Q2_K" if "down" in name else "IQ2_XXS"), name
        else:
            assert s.type == ttype, (name, s.type, ttype)


def test_layer_kinds_match_ds4_compress_ratio(ds4_c):
    fn = re.search(r"static uint32_t ds4_layer_compress_ratio\(uint32_t il\) \{(.*?)\n\}", ds4_c, re.S).group(1)
    assert "if (il < 2) return 0;" in fn and "(il & 1u) == 0 ? 4u : 128u" in fn
    assert [gg.compress_ratio(i) for i in range(6)] == [0, 0, 4, 128, 4, 128]
    names = {s.name for s in gg.tensor_specs(5)}
    assert {f"blk.{i}.indexer.proj.weight" for i in (2, 4)} <= names and "blk.3.indexer.proj.weight" not in names
    assert {f"blk.{i}.ffn_gate_tid2eid.weight" for i in range(3)} <= names and "blk.3.ffn_gate_tid2eid.weight" not in names


def test_metadata_covers_every_key_ds4_reads(ds4_c):
    validate = re.search(r"static void config_validate_model\(.*?\n\}\n", ds4_c, re.S).group(0)
    keys = set(re.findall(r"required_(?:u32|u64|f32|bool)\(m, \"([^\"]+)\"\)", validate))
    keys |= set(re.findall(r"const char \*key = \"(deepseek4\.[^\"]+)\";", ds4_c))
    meta = gg.metadata(5)
    assert keys <= set(meta), keys - set(meta)
    assert meta["deepseek4.block_count"] == ("u32", 5)
    for name, value in gg.DS4_FLOATS.items():
        macro = re.search(r"config_expect_f32\(\"" + re.escape(name) + r"\", \w+, (DS4_\w+)\)", validate).group(1)
        c_value = float(re.search(r"#define " + macro + r"\s+\(\s*([-0-9.e]+)f?\)", ds4_c).group(1))
        assert value == pytest.approx(c_value), name
    for tok in gg.SPECIAL_TOKENS:
        assert f'vocab_lookup(vocab, "{tok}")' in ds4_c


def test_full_size_is_what_the_issue_measured():
    assert 5.3e9 < gg.total_bytes(2) < 5.8e9
    assert 11.2e9 < gg.total_bytes(5) < 11.8e9


TINY = dict(gg.DS4_DIMS, N_EMBD=256, N_VOCAB=300, N_HEAD=4, N_HEAD_DIM=64, N_VALUE_DIM=64, N_OUT_GROUP=2,
            N_LORA_Q=256, N_LORA_O=256, N_EXPERT=8, N_FF_EXP=256, N_INDEXER_HEAD=4, N_INDEXER_HEAD_DIM=32)


def test_tiny_write_reads_back_with_valid_blocks(tmp_path):
    import gguf

    path = gg.write_gguf(tmp_path / "tiny.gguf", 5, d=TINY)
    r = gguf.GGUFReader(str(path))
    got = {t.name: t for t in r.tensors}
    specs = gg.tensor_specs(5, TINY)
    assert [t.name for t in r.tensors] == [s.name for s in specs]
    for s in specs:
        t = got[s.name]
        assert t.tensor_type.name == s.type and tuple(int(x) for x in t.shape) == s.ne, s.name
        if s.type in ("Q8_0", "Q2_K", "IQ2_XXS"):
            vals = gguf.quants.dequantize(t.data, t.tensor_type)
            assert np.isfinite(vals).all() and 0 < np.abs(vals).max() < 1e3, s.name
    f = r.fields["deepseek4.attention.compress_ratios"]
    assert [int(f.parts[i][0]) for i in f.data] == [0, 0, 4, 128, 4]
    toks = r.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(toks.parts[i]).decode() for i in toks.data]
    assert len(vocab) == TINY["N_VOCAB"] and len(set(vocab)) == len(vocab)
    assert vocab[-len(gg.SPECIAL_TOKENS):] == gg.SPECIAL_TOKENS and vocab[ord("a")] == "a"
    ids = np.asarray(got["blk.0.ffn_gate_tid2eid.weight"].data)
    assert all(len(set(row)) == row.size for row in ids.reshape(-1, 6))


# ---- the scratch build -----------------------------------------------------------

def test_scratch_copy_reduces_layers_and_adds_the_accessor(target, tmp_path):
    d = d4.scratch_copy(target, tmp_path / "s", 5)
    text = (d / "ds4.c").read_text()
    assert "    DS4_N_LAYER            = 5," in text and "= 43," not in text
    assert text.count("ds4_e2e_cpu_layer(") == 2 and text.count("ds4_e2e_gpu_layer(") == 2
    assert text.count("ds4_e2e_logits(") == 2
    assert (d / "ds4_e2e_accessor.c").is_file() and "ds4_e2e_accessor_cpu.o" in (d / d4.MAKE_FRAGMENT).read_text()
    assert (_checkout() / "ds4.c").read_text().count("= 43,") == 1  # the checkout itself is untouched
    cc = shutil.which("cc")
    if cc:
        for defs in (["-DDS4_NO_GPU"], []):
            for f in ("ds4.c", "ds4_e2e_accessor.c"):
                res = subprocess.run([cc, "-fsyntax-only", "-std=c99", "-D_GNU_SOURCE", *defs, f], cwd=d,
                                     capture_output=True, text=True)
                assert res.returncode == 0, res.stderr[-2000:]


def test_a_rule_that_does_not_match_is_refused(target, tmp_path):
    rules = d4.load_patch_rules(target) + [{"file": "ds4.c", "old": "no such text", "new": "x", "why": "stale"}]
    with pytest.raises(PorterError, match="occurs 0 times"):
        d4.apply_patch_rules((_checkout() / "ds4.c").read_text(), rules, "ds4.c", 5)
    with pytest.raises(PorterError, match="occurs 0 times"):
        d4.scratch_copy(target, tmp_path / "s", 5, [("no such cuda text", "x")])


def test_setup_names_every_file_the_reduced_build_is_made_of(target, tmp_path, monkeypatch):
    """A committed rule holds only for the ds4.c, patches and accessor it was measured with."""
    from porter.gates.e2e.gate import setup_mismatch

    red = d4.Ds4Reduced(target, tmp_path)
    calibrated = red.setup()
    assert setup_mismatch(calibrated, red.setup()) is None
    e2e_dir = tmp_path / "target" / "e2e"
    shutil.copytree(target.dir / "e2e", e2e_dir)
    monkeypatch.setattr(target, "dir", tmp_path / "target")
    for name, key in (("patches.toml", "patches_sha256"), (d4.ACCESSOR, "accessor_sha256")):
        original = (e2e_dir / name).read_bytes()
        (e2e_dir / name).write_bytes(original + b"\n")
        assert setup_mismatch(calibrated, red.setup()) == f"the rule was calibrated for another {key}"
        (e2e_dir / name).write_bytes(original)
    assert setup_mismatch(calibrated, red.setup()) is None


def test_make_and_run_commands(tmp_path):
    cpu = d4.make_command(tmp_path, "cpu", jobs=4)
    assert cpu[:7] == ["make", "-C", str(tmp_path), "-f", "Makefile", "-f", d4.MAKE_FRAGMENT]
    assert "cpu" in cpu and "CPU_CORE_OBJS=ds4_cpu.o ds4_e2e_accessor_cpu.o" in cpu
    up = d4.make_command(tmp_path, "cuda", cuda_arch="sm_90")
    assert "CUDA_ARCH=sm_90" in up and "CORE_OBJS=ds4.o ds4_e2e_accessor.o ds4_cuda.o" in up
    nv = next(a for a in up if a.startswith("NVCCFLAGS="))
    assert "-arch=sm_90" in nv and "--use_fast_math" in nv and "-g" not in nv.split()
    lib = tmp_path / "lib" / "libds4_cuda.so"
    mine = d4.make_command(tmp_path, "cuda", library=lib)
    assert f"CORE_OBJS=ds4.o ds4_e2e_accessor.o {lib.resolve()}" in mine
    assert any(a.startswith("CUDA_LDLIBS=") and f"-rpath -Xlinker {lib.parent.resolve()}" in a for a in mine)
    with pytest.raises(PorterError):
        d4.make_command(tmp_path, "metal")
    run = d4.run_command(tmp_path, Path("m.gguf"), "cuda", Path("p.txt"), 2356)
    assert run[0].endswith("/ds4") and "--cuda" in run and run[run.index("-c") + 1] == "2356"
    text = d4.prompt_text(2100)
    assert len(text) == 2100 and text.isascii() and "  " not in text
    pos = d4.sampled_positions(2064, 64)
    assert pos[0] == 0 and 2048 in pos and pos[-1] == 2064 + 47 and len(pos) == len(set(pos))
    assert set(range(2048, 2112)) <= set(pos)  # the run past the indexer's 2048 up to the template's tail


def _records(path: Path, items, row):
    with open(path, "wb") as f:
        for il, pos, val in items:
            f.write(struct.pack("<ii", il, pos))
            f.write(np.full(row, val, dtype=np.float32).tobytes())


def test_read_states_orders_layers_and_positions(tmp_path):
    p = tmp_path / "states.bin"
    # a chunked prefill writes layer 0..1 for the first chunk, then again for the second
    _records(p, [(0, 0, 1.0), (1, 0, 2.0), (0, 64, 3.0), (1, 64, 4.0)], row=8)
    states, pos = d4.read_states(p, 2, row=8)
    assert pos == [0, 64] and states.shape == (2, 2, 8)
    assert states[1, 1, 0] == 4.0 and states[0, 1, 0] == 3.0
    _records(p, [(0, 0, 1.0), (1, 0, 2.0), (0, 64, 3.0)], row=8)
    with pytest.raises(PorterError, match="other positions"):
        d4.read_states(p, 2, row=8)
    with pytest.raises(PorterError, match="layers"):
        d4.read_states(p, 3, row=8)
    p.write_bytes(b"\0" * 13)
    with pytest.raises(PorterError, match="whole number"):
        d4.read_states(p, 2, row=8)


def test_calibration_variants_apply_to_the_checkout(target):
    variants = d4.load_variants(target)
    goods = [v for v in variants if v.kind == "good"]
    broken = [v for v in variants if v.kind == "broken"]
    assert len(goods) >= 3 and any(v.env for v in goods) and any(v.source == "porter-library" for v in goods)
    # the gate's own library shape, as --provider reference ports it, is one of the known-good backends
    assert any(v.source == "reference-slices" for v in goods)
    assert len([v for v in broken if not v.name.startswith("integration-")]) >= 5
    assert len([v for v in broken if v.name.startswith("integration-")]) >= 2
    cu = (_checkout() / "ds4_cuda.cu").read_text()
    for v in broken:
        assert v.rules, v.name
    for v in variants:
        for search, replace in v.rules:
            assert cu.count(search) == 1 and search != replace, v.name
    # DS4_CUDA_WEIGHT_CACHE is inert while the whole map registers (measured on the H100): a variant
    # that asks for the cached-range path must refuse the registration too.  (A `[[broken.rule]]`
    # written under a `[[good]]` entry once gave that refusal to the broken entry before it.)
    refuse = "cudaError_t err = cudaErrorNotSupported; /* porter e2e: whole-map registration refused */"
    for v in variants:
        refused = any(refuse in r for _, r in v.rules)
        assert refused == ("DS4_CUDA_WEIGHT_CACHE" in v.env), v.name


# ---- porter's logprob-vector driver (the verdict: tests/test_e2e_from_logits.py) -----------

def test_logprob_commands(tmp_path):
    lib = tmp_path / "libds4_cuda.so"
    build = lp.build_command(tmp_path, lib)
    assert d4.LOGPROB_EXE in build and f"CORE_OBJS=ds4.o ds4_e2e_accessor.o {lib.resolve()}" in build
    assert "CORE_OBJS=ds4.o ds4_e2e_accessor.o ds4_cuda.o" in lp.build_command(tmp_path, None)
    argv = lp.run_command(tmp_path / "ds4_e2e_logprob", Path("/models/ds4flash.gguf"), tmp_path / "job.txt",
                          tmp_path / "out" / "results.txt")
    assert argv == [str(tmp_path / "ds4_e2e_logprob"), "/models/ds4flash.gguf", str(tmp_path / "job.txt"),
                    str(tmp_path / "out" / "results.txt")]
    frag = d4.make_fragment()
    assert f"{d4.LOGPROB_EXE}: {d4.LOGPROB_EXE}.o $(CORE_OBJS)" in frag


def test_logprob_driver_compiles_against_the_checkouts_api(tmp_path):
    """porter's driver program uses only ds4.h: it compiles against the user's checkout as it is."""
    src = _checkout()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    proc = subprocess.run([cc, "-std=c99", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                           f"-I{src}", str(ROOT / "targets" / "ds4" / "e2e" / d4.LOGPROB_SOURCE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- the calibration driver's plumbing, with the engine runs faked -------------------

def test_calibrate_ds4_builds_once_per_source_and_tabulates(target, tmp_path, monkeypatch):
    from porter.gates.e2e.compare import PrefillOutputs

    built, ran = [], []
    rng = np.random.default_rng(0)
    base = rng.standard_normal((5, 4, 32)).astype(np.float32)
    logits = rng.standard_normal((1, 50)).astype(np.float32)

    def fake_build(self, v):
        built.append(self.build_key(v))
        return tmp_path / self.build_key(v)

    def fake_run(self, build_dir, v):
        ran.append(v.name)
        drift = np.array([1e-4, 3e-4, 1e-3, 3e-3, 1e-2], dtype=np.float32)[:, None, None]  # grows with depth
        noise = rng.standard_normal(base.shape).astype(np.float32)
        states = base if v.kind == "reference" else base + base * drift * noise * (1.0 if v.kind == "good" else 0)
        if v.kind == "broken":
            states = base.copy()
            states[2:] *= 1.5  # wrong from layer 2 on
        return PrefillOutputs(states, self.stage_names, logits, [0], 1.0)

    monkeypatch.setattr(d4.Ds4Reduced, "ensure_model", lambda self, log=None: self.model)
    monkeypatch.setattr(d4.Ds4Reduced, "build", fake_build)
    monkeypatch.setattr(d4.Ds4Reduced, "run", fake_run)
    monkeypatch.setattr(d4.Ds4Reduced, "setup", lambda self: {"layers": self.n_layer})
    import porter.calibration.libraries as libs
    monkeypatch.setattr(libs, "build_upstream", lambda target, mutant=None, out_dir=None: tmp_path / "libds4_cuda.so")
    monkeypatch.setattr(d4, "reference_slices_library", lambda target, cache: tmp_path / "slices" / "libds4_cuda.so")

    cal = d4.calibrate(target, tmp_path, log=lambda *_: None)
    variants = d4.load_variants(target)
    # env-only variants share the upstream build: builds = reference + upstream + porter-library
    # + reference-slices + one per mutant
    n_mutated = len([v for v in variants if v.rules])
    assert len(set(built)) == 4 + n_mutated
    # the reference runs beside the CUDA variants (its thread may start after the first of them)
    assert ran.count("reference-cpu") == 1 and len(ran) == 1 + len(variants)
    assert cal.calibrated, cal.table()
    tol = cal.rule.stage_tol
    assert all(a < b for a, b in zip(tol, tol[1:]))  # per-layer ceilings follow the drift
    assert all(r.verdict.stage == "layer 2" for r in cal.rows if r.kind == "broken")


@pytest.mark.skipif(not os.environ.get("PORTER_E2E_DS4_SMOKE"),
                    reason="set PORTER_E2E_DS4_SMOKE=1: builds ds4's CPU path (~1.5 min) and runs a 5-layer prefill "
                           "on a sparse zero-weight GGUF (~1.5 min, ~2 MB of disk)")
def test_reduced_cpu_build_runs_on_a_zero_weight_model(target, tmp_path):
    """ds4 itself accepts the synthetic model (metadata, every tensor's layout, the tokenizer) with
    DS4_N_LAYER=5, and the accessor records every layer at the sampled positions, the head row and the logits."""
    from porter.target import Target

    model = gg.write_gguf(tmp_path / "zero.gguf", 5, zero_weights=True)
    spec = target.spec.model_copy(update={"e2e": target.spec.e2e.model_copy(
        update={"prompt_tokens": 40, "options": {"token_stride": 16}})})
    t = Target(spec, target.dir, target.checkout, target.workspace)
    red = d4.Ds4Reduced(t, tmp_path / "scratch", model)
    v = d4.Ds4Variant("reference-cpu", "reference", backend="cpu")
    out = red.run(red.build(v), v)
    assert out.states.shape[0] == 5 and out.states.shape[2] == d4.HC_ROW
    assert out.states.shape[1] >= len([p for p in red.positions if p < 40])
    assert out.logits.shape == (1, d4.N_VOCAB) and np.isfinite(out.logits).all()
    assert out.probes["head"].shape == (d4.N_EMBD,) and np.isfinite(out.probes["head"]).all()


def test_cpu_reference_is_run_once_per_model_and_a_damaged_copy_is_run_again(target, tmp_path, monkeypatch):
    """The minutes-long CPU reference is kept in the scratch folder keyed by build, model and
    prompt: a second calibration reuses it, another model file does not, and an unreadable copy
    (a run killed while writing) is run again rather than trusted."""
    from porter.gates.e2e.compare import PrefillOutputs

    runs = []
    rng = np.random.default_rng(0)

    def fake_run(self, build_dir, v):
        runs.append(v.name)
        return PrefillOutputs(rng.standard_normal((5, 3, 8)), self.stage_names, rng.standard_normal((1, 16)), [3],
                              2.0, probes={"head": rng.standard_normal(4)})

    monkeypatch.setattr(d4.Ds4Reduced, "run", fake_run)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    red = d4.Ds4Reduced(target, tmp_path / "scratch", model)
    v = d4.Ds4Variant("reference-cpu", "reference", backend="cpu")
    first = red.run_reference(tmp_path, v)
    again = red.run_reference(tmp_path, v)
    assert runs == ["reference-cpu"]
    assert np.array_equal(first.states, again.states) and np.array_equal(first.probes["head"], again.probes["head"])
    assert again.tokens == [3] and again.logits.shape == (1, 16)
    for f in (tmp_path / "scratch" / "reference-cache").glob("*.npz"):
        f.write_bytes(b"not an npz")
    red.run_reference(tmp_path, v)
    assert runs == ["reference-cpu"] * 2
    model.write_bytes(b"GGUF" + bytes(65))  # another model: another key
    red.run_reference(tmp_path, v)
    assert len(runs) == 3
