#!/usr/bin/env python3
"""Writes the minimoe fixture: a deterministic tiny GGUF with the real type mix.

    python targets/minimoe/make_fixture.py OUT.gguf [--seed N]

or, from Python, ``write_fixture(path, seed=0) -> Path``.

Tensors, types and metadata are exactly those of targets/minimoe/README.md ("The
model"): F16 embeddings and router, Q8_0 attention/output projections, IQ2_XXS
routed gate/up experts, Q2_K routed down experts, F32 norms and sinks.  About
1.6 MB, written in well under a second.

How the weights are made (each tensor from its own stream, seeded by
(seed, crc32(name)), so the file is a pure function of the seed):
  * F16/F32 tensors: normal values, scaled ~ 1/sqrt(fan_in) for matrices.
  * Q8_0: a normal matrix quantized by gguf-py (a bit-exact port of ggml's
    quantize_row_q8_0).
  * IQ2_XXS and Q2_K: gguf-py cannot quantize these, so they are valid random
    blocks (reference.quant.random_blocks): every grid point, sign pattern and
    sub-block scale in use, block scales chosen so that values have mean ~0 and
    std ~ 1/sqrt(fan_in).
Before writing, every tensor is decoded through gguf-py's dequantizers and
checked (finite, magnitude within a factor of 3 of the target); after writing,
the file is read back with GGUFReader and its census and bytes compared.  Any
failure raises (exit status 1 from the command line).
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

try:
    import reference.quant as rq
except ImportError:  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import reference.quant as rq

import gguf
from gguf import GGMLQuantizationType as QT

ARCH = "minimoe"

#: Model dimensions (targets/minimoe/README.md, "The model").
DIMS = {
    "n_vocab": 512, "n_embd": 256, "n_head": 4, "head_dim": 64, "n_rot": 16,
    "n_layer": 2, "n_expert": 8, "top_k": 2, "n_ff": 256, "window": 32,
    "freq_base": 10000.0, "eps": 1e-6,
}

#: GGUF metadata: key -> (dims key, kind).
METADATA = {
    f"{ARCH}.vocab_size": ("n_vocab", "u32"),
    f"{ARCH}.embedding_length": ("n_embd", "u32"),
    f"{ARCH}.block_count": ("n_layer", "u32"),
    f"{ARCH}.attention.head_count": ("n_head", "u32"),
    f"{ARCH}.attention.key_length": ("head_dim", "u32"),
    f"{ARCH}.rope.dimension_count": ("n_rot", "u32"),
    f"{ARCH}.rope.freq_base": ("freq_base", "f32"),
    f"{ARCH}.expert_count": ("n_expert", "u32"),
    f"{ARCH}.expert_used_count": ("top_k", "u32"),
    f"{ARCH}.expert_feed_forward_length": ("n_ff", "u32"),
    f"{ARCH}.attention.sliding_window": ("window", "u32"),
    f"{ARCH}.attention.layer_norm_rms_epsilon": ("eps", "f32"),
}


def tensor_specs(d: dict = DIMS) -> list[tuple[str, QT, tuple[int, ...]]]:
    """(name, type, row-major shape) of every tensor, in file order."""
    E, H, D, V = d["n_embd"], d["n_head"], d["head_dim"], d["n_vocab"]
    X, F = d["n_expert"], d["n_ff"]
    specs = [("token_embd.weight", QT.F16, (V, E))]
    for i in range(d["n_layer"]):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", QT.F32, (E,)),
            (b + "attn_q.weight", QT.Q8_0, (H * D, E)),
            (b + "attn_k.weight", QT.Q8_0, (D, E)),
            (b + "attn_v.weight", QT.Q8_0, (D, E)),
            (b + "attn_output.weight", QT.Q8_0, (E, H * D)),
            (b + "attn_sinks.weight", QT.F32, (H,)),
            (b + "ffn_norm.weight", QT.F32, (E,)),
            (b + "ffn_gate_inp.weight", QT.F16, (X, E)),
            (b + "ffn_gate_exps.weight", QT.IQ2_XXS, (X, F, E)),
            (b + "ffn_up_exps.weight", QT.IQ2_XXS, (X, F, E)),
            (b + "ffn_down_exps.weight", QT.Q2_K, (X, E, F)),
        ]
    specs += [("output_norm.weight", QT.F32, (E,)), ("output.weight", QT.Q8_0, (V, E))]
    return specs


def _target(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) the values of a tensor are drawn around."""
    fan_in = shape[-1]
    if name == "token_embd.weight":
        return 0.0, 1.0
    if name.endswith("_norm.weight"):
        return 1.0, 0.1
    if name.endswith("attn_sinks.weight"):
        return 0.0, 1.0
    if name.endswith("ffn_gate_inp.weight"):
        return 0.0, 2.0 / np.sqrt(fan_in)     # router logits of std ~2: experts differ per token
    if name == "output.weight":
        return 0.0, 3.0 / np.sqrt(fan_in)     # logits of std ~3: clear greedy margins
    return 0.0, 1.0 / np.sqrt(fan_in)


def _make(name: str, qt: QT, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes as a uint8 array (..., row_bytes), or F16/F32 values."""
    mean, std = _target(name, shape)
    if qt in (QT.F32, QT.F16):
        vals = mean + std * rng.standard_normal(shape)
        return vals.astype(np.float32 if qt == QT.F32 else np.float16)
    if qt == QT.Q8_0:
        return rq.quantize_q8_0(mean + std * rng.standard_normal(shape))
    n_rows = int(np.prod(shape[:-1]))
    raw = rq.random_blocks(qt, n_rows, shape[-1], rng, scale=std)
    return raw.reshape(*shape[:-1], raw.shape[-1])


def _check(name: str, qt: QT, shape: tuple[int, ...], data: np.ndarray) -> None:
    """Decode through gguf-py and fail loudly on non-finite or off-scale values."""
    vals = rq.dequantize(data, qt, shape).astype(np.float64)
    mean, std = _target(name, shape)
    if vals.shape != shape or not np.all(np.isfinite(vals)):
        raise RuntimeError(f"fixture tensor {name} ({qt.name}) decodes to non-finite values")
    got_std = float(vals.std()) if vals.size > 1 else 0.0
    got_mean = float(vals.mean())
    if vals.size >= 64 and not (std / 3 <= got_std <= std * 3):
        raise RuntimeError(f"fixture tensor {name} ({qt.name}): std {got_std:.4g}, target {std:.4g}")
    if vals.size >= 64 and abs(got_mean - mean) > max(0.5 * std, 1e-3):
        raise RuntimeError(f"fixture tensor {name} ({qt.name}): mean {got_mean:.4g}, target {mean:.4g}")
    if qt not in (QT.F16, QT.F32):
        # the independent decoder must agree with gguf-py on these bytes
        ind = rq.dequantize_independent(data, qt, shape).astype(np.float64)
        if not np.allclose(ind, vals, rtol=1e-6, atol=1e-7 * max(1.0, float(np.abs(vals).max()))):
            raise RuntimeError(f"fixture tensor {name}: gguf-py and reference.quant disagree")


def build_tensors(seed: int = 0) -> list[tuple[str, QT, tuple[int, ...], np.ndarray]]:
    """All tensors, generated and checked: (name, type, shape, data)."""
    out = []
    for name, qt, shape in tensor_specs():
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        data = _make(name, qt, shape, rng)
        _check(name, qt, shape, data)
        out.append((name, qt, shape, data))
    return out


def write_fixture(path, seed: int = 0) -> Path:
    """Writes the fixture GGUF to ``path`` (parents created) and returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = build_tensors(seed)
    w = gguf.GGUFWriter(str(path), ARCH)
    for key, (dim, kind) in METADATA.items():
        if kind == "u32":
            w.add_uint32(key, int(DIMS[dim]))
        else:
            w.add_float32(key, float(DIMS[dim]))
    for name, qt, shape, data in tensors:
        if qt in (QT.F32, QT.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _verify_file(path, tensors)
    return path


def _verify_file(path: Path, tensors) -> None:
    r = gguf.GGUFReader(str(path))
    got = {t.name: t for t in r.tensors}
    if set(got) != {n for n, *_ in tensors}:
        raise RuntimeError(f"{path}: tensor names differ from the contract")
    for name, qt, shape, data in tensors:
        t = got[name]
        if t.tensor_type != qt or tuple(int(s) for s in reversed(t.shape)) != shape:
            raise RuntimeError(f"{path}: {name} is {t.tensor_type.name} {list(t.shape)}, want {qt.name} {shape}")
        if bytes(np.asarray(t.data).reshape(-1).view(np.uint8)) != bytes(np.ascontiguousarray(data).reshape(-1).view(np.uint8)):
            raise RuntimeError(f"{path}: bytes of {name} differ from what was written")
    arch = r.fields["general.architecture"]
    if bytes(arch.parts[arch.data[0]]).decode() != ARCH:
        raise RuntimeError(f"{path}: general.architecture is not {ARCH}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write the deterministic minimoe fixture GGUF.")
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    a = ap.parse_args(argv)
    try:
        p = write_fixture(a.out, a.seed)
    except Exception as e:  # noqa: BLE001 - one clear line, non-zero exit
        print(f"make_fixture: {e}", file=sys.stderr)
        return 1
    print(f"{p} ({p.stat().st_size} bytes, seed {a.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
