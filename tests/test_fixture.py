"""targets/minimoe/make_fixture.py: determinism, the contract's census, size,
speed, and a numerically sane model (checked with the numpy reference forward).
"""
from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

import reference.quant as rq
from reference.minimoe_model import MiniMoeModel, Trace

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "targets" / "minimoe" / "make_fixture.py"


def _load_make_fixture():
    spec = importlib.util.spec_from_file_location("minimoe_make_fixture", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mf = _load_make_fixture()

# The census, written out again from targets/minimoe/README.md (row-major [out][in]),
# independently of make_fixture's own table.
CONTRACT_TENSORS = {"token_embd.weight": ("F16", (512, 256)),
                    "output_norm.weight": ("F32", (256,)),
                    "output.weight": ("Q8_0", (512, 256))}
for _i in range(2):
    CONTRACT_TENSORS.update({
        f"blk.{_i}.attn_norm.weight": ("F32", (256,)),
        f"blk.{_i}.attn_q.weight": ("Q8_0", (256, 256)),
        f"blk.{_i}.attn_k.weight": ("Q8_0", (64, 256)),
        f"blk.{_i}.attn_v.weight": ("Q8_0", (64, 256)),
        f"blk.{_i}.attn_output.weight": ("Q8_0", (256, 256)),
        f"blk.{_i}.attn_sinks.weight": ("F32", (4,)),
        f"blk.{_i}.ffn_norm.weight": ("F32", (256,)),
        f"blk.{_i}.ffn_gate_inp.weight": ("F16", (8, 256)),
        f"blk.{_i}.ffn_gate_exps.weight": ("IQ2_XXS", (8, 256, 256)),
        f"blk.{_i}.ffn_up_exps.weight": ("IQ2_XXS", (8, 256, 256)),
        f"blk.{_i}.ffn_down_exps.weight": ("Q2_K", (8, 256, 256)),
    })
CONTRACT_METADATA = {
    "general.architecture": "minimoe",
    "minimoe.vocab_size": 512, "minimoe.embedding_length": 256, "minimoe.block_count": 2,
    "minimoe.attention.head_count": 4, "minimoe.attention.key_length": 64,
    "minimoe.rope.dimension_count": 16, "minimoe.rope.freq_base": 10000.0,
    "minimoe.expert_count": 8, "minimoe.expert_used_count": 2,
    "minimoe.expert_feed_forward_length": 256, "minimoe.attention.sliding_window": 32,
    "minimoe.attention.layer_norm_rms_epsilon": 1e-6,
}


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory) -> Path:
    return mf.write_fixture(tmp_path_factory.mktemp("fixture") / "minimoe.gguf", seed=0)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(fixture_path, tmp_path):
    again = mf.write_fixture(tmp_path / "again.gguf", seed=0)
    other = mf.write_fixture(tmp_path / "other.gguf", seed=1)
    assert sha(again) == sha(fixture_path)
    assert sha(other) != sha(fixture_path)
    assert other.stat().st_size == fixture_path.stat().st_size


def test_command_line_writes_the_same_file(fixture_path, tmp_path):
    out = tmp_path / "sub" / "cli.gguf"
    r = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sha(out) == sha(fixture_path)
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "s7.gguf"), "--seed", "7"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sha(tmp_path / "s7.gguf") == sha(mf.write_fixture(tmp_path / "s7b.gguf", seed=7))


def test_size(tmp_path):
    # small enough to make in every test session; how long it takes is a benchmark's figure, not a test's
    size = mf.write_fixture(tmp_path / "sized.gguf", seed=3).stat().st_size
    assert 1_000_000 < size < 8_000_000


def test_census_matches_contract(fixture_path):
    r = gguf.GGUFReader(str(fixture_path))
    got = {t.name: (t.tensor_type.name, tuple(int(s) for s in reversed(t.shape.tolist()))) for t in r.tensors}
    assert got == CONTRACT_TENSORS
    for t in r.tensors:
        assert t.data_offset % 32 == 0, t.name                   # ggml's default alignment
        qt = t.tensor_type
        shape = got[t.name][1]
        assert t.n_bytes == rq.tensor_bytes(qt, shape)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(meta) == set(CONTRACT_METADATA)
    for k, v in CONTRACT_METADATA.items():
        if isinstance(v, float):
            assert meta[k] == pytest.approx(v, rel=1e-6), k
        else:
            assert meta[k] == v, k
    assert r.fields["minimoe.rope.freq_base"].types == [gguf.GGUFValueType.FLOAT32]
    assert r.fields["minimoe.block_count"].types == [gguf.GGUFValueType.UINT32]


def test_every_tensor_decodes_finite_and_on_scale(fixture_path):
    r = gguf.GGUFReader(str(fixture_path))
    for t in r.tensors:
        shape = CONTRACT_TENSORS[t.name][1]
        v = rq.dequantize(np.asarray(t.data), t.tensor_type, shape).astype(np.float64)
        assert np.all(np.isfinite(v)), t.name
        if t.name.endswith("_norm.weight"):
            assert 0.5 < v.mean() < 1.5, t.name
        elif v.size >= 64:
            fan_in = shape[-1]
            assert 0.2 / np.sqrt(fan_in) < v.std() < 5.0, t.name
            assert abs(v.mean()) < 0.5 * v.std(), t.name
        if t.tensor_type in (QT.IQ2_XXS, QT.Q2_K, QT.Q8_0):
            ind = rq.dequantize_independent(np.asarray(t.data), t.tensor_type, shape)
            assert np.abs(ind - v).max() <= 1e-6 * np.abs(v).max(), t.name


def test_model_is_numerically_sane(fixture_path):
    """2 layers + 16 decode steps: finite, non-degenerate activations; the
    router picks different experts for different tokens; tokens vary."""
    m = MiniMoeModel(fixture_path)
    prompt = [(7 * i + 3) % 512 for i in range(20)]
    traces: list[Trace] = []
    toks = m.generate(prompt, 16, traces)
    assert len(toks) == 17 and all(0 <= t < 512 for t in toks)
    for tr in traces:
        assert np.all(np.isfinite(tr.logits))
        assert 0.5 < float(np.std(tr.logits)) < 20
        assert all(0.2 < h < 20 for h in tr.h_rms), tr.h_rms
    assert len(set(toks)) >= 8, toks                          # greedy output is not stuck
    for layer in range(2):
        ids = np.concatenate([tr.expert_ids[layer] for tr in traces])
        firsts = {int(i) for i in ids[:, 0]}
        assert len(firsts) >= 3, (layer, firsts)              # not the same expert for every token
        assert len(np.unique(ids)) >= 6, (layer, np.unique(ids))
    # greedy margins are wide compared with float32 noise (so engines agree)
    margins = [np.diff(np.sort(tr.logits.astype(np.float64))[-2:])[0] for tr in traces]
    print(f"tokens {toks}; smallest top-2 logit margin {min(margins):.4f}")
    assert min(margins) > 1e-3


def test_fail_loudly_on_bad_blocks(monkeypatch, tmp_path):
    """The script's own check rejects blocks whose decoded values are off-scale."""
    real = rq.random_blocks

    def broken(qtype, n_rows, n_cols, rng, scale=None):
        raw = real(qtype, n_rows, n_cols, rng, scale)
        if rq.qtype_of(qtype) == QT.IQ2_XXS:
            raw = raw.copy()
            raw[:, 0:2] = np.frombuffer(np.float16(60000.0).tobytes(), np.uint8)   # huge d in every block
        return raw

    monkeypatch.setattr(mf.rq, "random_blocks", broken)
    with pytest.raises(RuntimeError, match="IQ2_XXS"):
        mf.write_fixture(tmp_path / "bad.gguf")


def test_specs_side_by_side_never_read_a_half_written_fixture(tmp_path):
    """calibrate --jobs 4 on a fresh workspace: several specs asked for the fixture at once, one read the
    GGUF while another was still writing it ("cannot reshape array of size 14208", measured on an H100).
    ensure_fixture writes it once, under a name of its own, and renames the whole file into place."""
    import threading
    from types import SimpleNamespace

    from porter.spec import ensure_fixture

    slow = tmp_path / "slow_fixture.py"
    # writes its output in two halves with a pause between, and counts its runs
    slow.write_text("import sys, time, pathlib\n"
                    f"runs = pathlib.Path({str(tmp_path / 'runs.txt')!r})\n"
                    "runs.open('a').write('x')\n"
                    "out = open(sys.argv[1], 'wb'); out.write(b'A' * 1000); out.flush(); time.sleep(0.5)\n"
                    "out.write(b'B' * 1000); out.close()\n")
    target = SimpleNamespace(name="t", fixture_path=tmp_path / "fx" / "model.gguf", fixture_script=slow,
                             workspace=tmp_path)
    seen, errors = [], []

    def reader():
        try:
            seen.append(ensure_fixture(target).read_bytes())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(len(b) == 2000 for b in seen), [len(b) for b in seen]
    assert (tmp_path / "runs.txt").read_text() == "x"  # written once
    assert [p.name for p in (tmp_path / "fx").iterdir()] == ["model.gguf"]  # no temporary left
