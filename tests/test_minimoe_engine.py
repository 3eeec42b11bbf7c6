"""End-to-end checks of the minimoe engine on its CPU backend.

Builds targets/minimoe/{engine.c, mini_cpu.c} with the system C compiler into a
temporary folder, writes the fixture GGUF with targets/minimoe/make_fixture.py,
runs prefill + 16 greedy decode steps and checks that the run is repeatable and
not degenerate.  Then feeds the engine broken model files (missing, bad magic,
truncated, a missing tensor, a tensor of the wrong GGUF type) and checks that
each is refused with one clear line on stderr and exit status 1.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "targets" / "minimoe"
FIXTURE_SCRIPT = TARGET / "make_fixture.py"
N_DECODE = 16


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc/gcc/clang) on PATH")
    return cc


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("minimoe-build") / "minimoe-cpu"
    cmd = [_cc(), "-O2", "-Wall", "-Wextra", "-Werror", "-DMINI_BACKEND_NAME=\"cpu\"",
           "-o", str(out), str(TARGET / "engine.c"), str(TARGET / "mini_cpu.c"), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"engine build failed (warnings are errors):\n{res.stderr}"
    return out


@pytest.fixture(scope="module")
def fixture_gguf(tmp_path_factory) -> Path:
    if not FIXTURE_SCRIPT.exists():
        pytest.skip(f"{FIXTURE_SCRIPT.relative_to(ROOT)} does not exist yet")
    out = tmp_path_factory.mktemp("minimoe-fixture") / "minimoe.gguf"
    res = subprocess.run([sys.executable, str(FIXTURE_SCRIPT), str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, f"make_fixture.py failed:\n{res.stdout}\n{res.stderr}"
    assert out.is_file() and out.stat().st_size > 0
    return out


def run_engine(engine: Path, model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(engine), str(model), *args], capture_output=True, text=True, timeout=120)


def parse_output(stdout: str) -> tuple[list[int], str]:
    lines = stdout.splitlines()
    assert len(lines) == 2, f"expected a tokens line and a digest line, got:\n{stdout}"
    assert lines[0].startswith("tokens:"), lines[0]
    assert lines[1].startswith("digest: fnv1a64="), lines[1]
    return [int(t) for t in lines[0].split()[1:]], lines[1]


def assert_refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 1, nothing on stdout, exactly one stderr line naming the problem."""
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{res.stderr}"
    assert lines[0].startswith("minimoe: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


# ---- The happy path -----------------------------------------------------------

def test_prefill_and_decode_are_repeatable(engine, fixture_gguf):
    runs = [run_engine(engine, fixture_gguf, "--decode", str(N_DECODE)) for _ in range(2)]
    for res in runs:
        assert res.returncode == 0, res.stderr
    (tok_a, dig_a), (tok_b, dig_b) = (parse_output(r.stdout) for r in runs)
    assert tok_a == tok_b
    assert dig_a == dig_b
    # t0 comes from the prefill logits, then one token per decode step.
    assert len(tok_a) == 1 + N_DECODE
    assert all(0 <= t < 512 for t in tok_a)
    # A degenerate model (every step the same token) would hide forward bugs.
    assert len(set(tok_a)) > 1, f"degenerate generation: {tok_a}"


def test_defaults_are_an_8_token_prompt_and_16_steps(engine, fixture_gguf):
    res = run_engine(engine, fixture_gguf, "--verbose")
    assert res.returncode == 0, res.stderr
    tokens, _ = parse_output(res.stdout)
    assert len(tokens) == 1 + 16
    assert "backend=cpu" in res.stderr and "prompt=8 decode=16" in res.stderr
    quiet = run_engine(engine, fixture_gguf)
    assert quiet.stderr == "" and quiet.stdout == res.stdout


def test_prompt_and_decode_options(engine, fixture_gguf):
    res = run_engine(engine, fixture_gguf, "--prompt", "5,6,7", "--decode", "3")
    assert res.returncode == 0, res.stderr
    tokens, digest = parse_output(res.stdout)
    assert len(tokens) == 4
    other = run_engine(engine, fixture_gguf, "--prompt", "5,6,8", "--decode", "3")
    assert parse_output(other.stdout)[1] != digest, "the prompt does not reach the logits"


def test_logits_out_matches_the_tokens(engine, fixture_gguf, tmp_path):
    path = tmp_path / "logits.f32"
    res = run_engine(engine, fixture_gguf, "--decode", "5", "--logits-out", str(path))
    assert res.returncode == 0, res.stderr
    tokens, _ = parse_output(res.stdout)
    logits = np.fromfile(path, dtype=np.float32).reshape(1 + 5, 512)
    assert np.isfinite(logits).all()
    assert [int(np.argmax(row)) for row in logits] == tokens


def test_decode_continues_the_prefill(engine, fixture_gguf):
    """Prefilling p + [t0] gives the same next token as prefill p then one decode step:
    the KV cache written by prefill is what decode attends to."""
    res = run_engine(engine, fixture_gguf, "--prompt", "3,14,15,92", "--decode", "1")
    t0, t1 = parse_output(res.stdout)[0]
    res2 = run_engine(engine, fixture_gguf, "--prompt", f"3,14,15,92,{t0}", "--decode", "0")
    assert parse_output(res2.stdout)[0] == [t1]


# ---- Refusals -------------------------------------------------------------------

def test_missing_file(engine, tmp_path):
    assert_refused(run_engine(engine, tmp_path / "nope.gguf"), "nope.gguf", "cannot open")


def test_bad_magic(engine, fixture_gguf, tmp_path):
    bad = tmp_path / "bad_magic.gguf"
    data = bytearray(fixture_gguf.read_bytes())
    data[:4] = b"GGML"
    bad.write_bytes(bytes(data))
    assert_refused(run_engine(engine, bad), "bad magic")


def test_not_a_gguf_at_all(engine, tmp_path):
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    assert_refused(run_engine(engine, bad), "not a GGUF file")


@pytest.mark.parametrize("keep", [10, 200, "half", -1])
def test_truncated(engine, fixture_gguf, tmp_path, keep):
    data = fixture_gguf.read_bytes()
    n = len(data) // 2 if keep == "half" else (len(data) + keep if keep < 0 else keep)
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[:n])
    assert_refused(run_engine(engine, bad), "truncated")


def test_prompt_token_outside_vocabulary(engine, fixture_gguf):
    assert_refused(run_engine(engine, fixture_gguf, "--prompt", "1,512"), "512", "vocabulary")


def test_bad_command_line(engine, fixture_gguf):
    assert_refused(run_engine(engine, fixture_gguf, "--prompt", "1,,2"), "--prompt")
    assert_refused(run_engine(engine, fixture_gguf, "--decode", "many"), "--decode")


# ---- Rewritten files: one fault at a time -------------------------------------

def rewrite_gguf(src: Path, dst: Path, *, drop: str | None = None,
                 as_f32: str | None = None) -> None:
    """Copies src to dst with gguf-py, optionally dropping one tensor or storing
    one tensor (dequantized) as F32 instead of its real type."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name == drop:
            continue
        if t.name == as_f32:
            values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            writer.add_tensor(t.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_rewritten_fixture_runs_identically(engine, fixture_gguf, tmp_path):
    """Control for the two tests below: the rewrite alone changes nothing."""
    copy = tmp_path / "copy.gguf"
    rewrite_gguf(fixture_gguf, copy)
    a = run_engine(engine, fixture_gguf, "--decode", "4")
    b = run_engine(engine, copy, "--decode", "4")
    assert b.returncode == 0, b.stderr
    assert a.stdout == b.stdout


def test_missing_tensor(engine, fixture_gguf, tmp_path):
    bad = tmp_path / "missing.gguf"
    rewrite_gguf(fixture_gguf, bad, drop="blk.1.ffn_down_exps.weight")
    assert_refused(run_engine(engine, bad), "missing tensor blk.1.ffn_down_exps.weight")


@pytest.mark.parametrize("name,expected", [
    ("blk.0.attn_q.weight", "Q8_0"),
    ("blk.1.ffn_gate_exps.weight", "IQ2_XXS"),
    ("token_embd.weight", "F16"),
])
def test_wrong_tensor_type(engine, fixture_gguf, tmp_path, name, expected):
    bad = tmp_path / "wrong_type.gguf"
    rewrite_gguf(fixture_gguf, bad, as_f32=name)
    assert_refused(run_engine(engine, bad), name, "type F32", f"expected {expected}")


# ---- The CPU backend as a library: block decoders and refusals ----------------

@pytest.fixture(scope="module")
def cpu_lib(tmp_path_factory):
    import ctypes

    out = tmp_path_factory.mktemp("minimoe-lib") / "libmini_cpu.so"
    res = subprocess.run([_cc(), "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                          "-o", str(out), str(TARGET / "mini_cpu.c"), "-lm"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return ctypes.CDLL(str(out))


def _tensor(arr):
    """A borrowed (owner = 0) tensor around a numpy array: {data, bytes, owner}."""
    import ctypes

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("owner", ctypes.c_int32)]

    return ctypes.byref(Tensor(arr.ctypes.data, arr.nbytes, 0))


def _random_blocks(qtype, n_blocks, rng):
    """Random blocks of a GGML type with sane f16 scales, and their gguf-py decoding."""
    gguf = pytest.importorskip("gguf")
    block_vals, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = {"Q8_0": (0, 1), "IQ2_XXS": (0, 1), "Q4_K": (0, 2), "Q2_K": (80, 2)}.get(qtype.name)
    if scales:
        start, count = scales
        d = rng.uniform(0.01, 0.1, n_blocks * count).astype(np.float16)
        raw[:, start:start + 2 * count] = d.view(np.uint8).reshape(n_blocks, 2 * count)
    if qtype.name == "F16":
        raw = rng.standard_normal(n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw, gguf.quants.dequantize(raw, qtype).reshape(n_blocks * block_vals).astype(np.float64)


@pytest.mark.parametrize("qname,fn", [("Q8_0", "mini_gpu_matmul_q8_0_tensor"),
                                      ("F16", "mini_gpu_matmul_f16_tensor"),
                                      ("Q4_K", "mini_gpu_matmul_q4_k_tensor")])
def test_cpu_dense_decoders_match_gguf_py(cpu_lib, qname, fn):
    import ctypes

    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[qname]
    rng = np.random.default_rng(7)
    in_dim, out_dim, n_tok = 512, 3, 2
    raw, w = _random_blocks(qtype, out_dim * in_dim // gguf.GGML_QUANT_SIZES[qtype][0], rng)
    model = np.concatenate([np.zeros(5, np.uint8), raw.ravel()])       # weight at an odd offset
    x = rng.standard_normal((n_tok, in_dim)).astype(np.float32)
    y = np.full((n_tok, out_dim), np.nan, np.float32)
    rc = getattr(cpu_lib, fn)(_tensor(y), ctypes.c_void_p(model.ctypes.data), ctypes.c_uint64(model.nbytes),
                              ctypes.c_uint64(5), ctypes.c_uint64(in_dim), ctypes.c_uint64(out_dim),
                              _tensor(x), ctypes.c_uint64(n_tok))
    assert rc == 0
    ref = x.astype(np.float64) @ w.reshape(out_dim, in_dim).T
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)
    # A weight range past the end of the map is refused.
    assert getattr(cpu_lib, fn)(_tensor(y), ctypes.c_void_p(model.ctypes.data), ctypes.c_uint64(model.nbytes - 1),
                                ctypes.c_uint64(5), ctypes.c_uint64(in_dim), ctypes.c_uint64(out_dim),
                                _tensor(x), ctypes.c_uint64(n_tok)) != 0


def test_cpu_routed_decoders_match_gguf_py(cpu_lib):
    import ctypes

    gguf = pytest.importorskip("gguf")
    QT = gguf.GGMLQuantizationType
    rng = np.random.default_rng(11)
    n_embd, n_ff, n_expert, n_tok, top_k = 256, 256, 3, 2, 2
    gate_raw, wg = _random_blocks(QT.IQ2_XXS, n_expert * n_ff * n_embd // 256, rng)
    up_raw, wu = _random_blocks(QT.IQ2_XXS, n_expert * n_ff * n_embd // 256, rng)
    down_raw, wd = _random_blocks(QT.Q2_K, n_expert * n_embd * n_ff // 256, rng)
    model = np.concatenate([gate_raw.ravel(), up_raw.ravel(), down_raw.ravel()])
    up_off, down_off = gate_raw.nbytes, gate_raw.nbytes + up_raw.nbytes
    wg, wu = wg.reshape(n_expert, n_ff, n_embd), wu.reshape(n_expert, n_ff, n_embd)
    wd = wd.reshape(n_expert, n_embd, n_ff)
    x = rng.standard_normal((n_tok, n_embd)).astype(np.float32)
    ids = np.array([[2, 0], [1, 2]], np.int32)
    wts = np.array([[0.7, 0.3], [0.4, 0.6]], np.float32)
    gate = np.full((n_tok, top_k, n_ff), np.nan, np.float32)
    up = np.full_like(gate, np.nan)
    mp, ms = ctypes.c_void_p(model.ctypes.data), ctypes.c_uint64(model.nbytes)

    def gate_up(ids_arr):
        return cpu_lib.mini_gpu_routed_gate_up_iq2_xxs_tensor(
            _tensor(gate), _tensor(up), mp, ms, ctypes.c_uint64(0), ctypes.c_uint64(up_off),
            n_embd, n_ff, n_expert, _tensor(x), _tensor(ids_arr), n_tok, top_k)

    assert gate_up(ids) == 0
    for t in range(n_tok):
        for k in range(top_k):
            np.testing.assert_allclose(gate[t, k], wg[ids[t, k]] @ x[t], rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(up[t, k], wu[ids[t, k]] @ x[t], rtol=1e-5, atol=1e-4)

    mid = rng.standard_normal((n_tok, top_k, n_ff)).astype(np.float32)
    out = np.full((n_tok, n_embd), np.nan, np.float32)

    def down(ids_arr):
        return cpu_lib.mini_gpu_routed_down_q2_k_tensor(
            _tensor(out), mp, ms, ctypes.c_uint64(down_off), n_ff, n_embd, n_expert,
            _tensor(mid), _tensor(ids_arr), _tensor(wts), n_tok, top_k)

    assert down(ids) == 0
    ref = np.stack([sum(wts[t, k] * (wd[ids[t, k]] @ mid[t, k]) for k in range(top_k)) for t in range(n_tok)])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)

    # An expert id outside [0, n_expert) is an error, and nothing is written.
    for bad in (n_expert, -1):
        bad_ids = ids.copy()
        bad_ids[1, 1] = bad
        gate[:] = np.nan
        out[:] = np.nan
        assert gate_up(bad_ids) != 0 and np.isnan(gate).all()
        assert down(bad_ids) != 0 and np.isnan(out).all()


def test_cpu_embed_refuses_token_outside_vocabulary(cpu_lib):
    import ctypes

    n_vocab, n_embd = 4, 8
    table = np.arange(n_vocab * n_embd, dtype=np.float16)
    model = table.view(np.uint8)
    out = np.full((2, n_embd), np.nan, np.float32)

    def embed(tokens):
        return cpu_lib.mini_gpu_embed_rows_tensor(_tensor(out), _tensor(tokens), ctypes.c_void_p(model.ctypes.data),
                                                  ctypes.c_uint64(model.nbytes), ctypes.c_uint64(0),
                                                  n_vocab, n_embd, 2)

    assert embed(np.array([3, 1], np.int32)) == 0
    np.testing.assert_array_equal(out, table.reshape(n_vocab, n_embd)[[3, 1]].astype(np.float32))
    for bad in (n_vocab, -1):
        out[:] = np.nan
        assert embed(np.array([0, bad], np.int32)) != 0
        assert np.isnan(out).all()
