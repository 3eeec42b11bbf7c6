"""Full numpy forward of the minimoe engine, for end-to-end cross-checks.

It follows targets/minimoe/README.md "Engine forward" op by op, calling the op references
of ``reference.minimoe_ops`` on the weights of a GGUF read with
``gguf.GGUFReader`` (offsets into the file's bytes, as the engine reads its
memory map).  Every activation is stored as float32 between ops, as the engine
stores it; each op computes in float64.

    m = MiniMoeModel("runs/fixtures/minimoe.gguf")
    tokens = m.generate([1, 2, 3], n_decode=16)   # 17 greedy tokens

``generate`` returns the token chosen after the prefill followed by one token
per decode step (step i feeds the token chosen before it), so n_decode steps
give n_decode + 1 tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import gguf

from . import minimoe_ops as ops
from .quant import QT, tensor_bytes

ARCH = "minimoe"


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    head_dim: int
    n_rot: int
    freq_base: float
    n_expert: int
    top_k: int
    n_ff: int
    window: int
    eps: float


@dataclass
class Trace:
    """What one forward call saw (for sanity checks and debugging)."""
    h_rms: list = field(default_factory=list)          # per layer, rms of the residual after it
    expert_ids: list = field(default_factory=list)     # per layer, int32 [n][top_k]
    logits: np.ndarray | None = None                   # float32 [n_vocab] of the last row


def _field_value(reader: gguf.GGUFReader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise KeyError(f"GGUF metadata key {key} is missing")
    return f.contents()


class MiniMoeModel:
    def __init__(self, path, max_ctx: int = 4096):
        self.path = Path(path)
        reader = gguf.GGUFReader(str(self.path))
        arch = _field_value(reader, "general.architecture")
        if arch != ARCH:
            raise ValueError(f"{path}: architecture {arch!r}, want {ARCH!r}")
        g = lambda k: _field_value(reader, f"{ARCH}.{k}")  # noqa: E731
        self.hp = HParams(
            n_vocab=int(g("vocab_size")), n_embd=int(g("embedding_length")), n_layer=int(g("block_count")),
            n_head=int(g("attention.head_count")), head_dim=int(g("attention.key_length")),
            n_rot=int(g("rope.dimension_count")), freq_base=float(g("rope.freq_base")),
            n_expert=int(g("expert_count")), top_k=int(g("expert_used_count")),
            n_ff=int(g("expert_feed_forward_length")), window=int(g("attention.sliding_window")),
            eps=float(g("attention.layer_norm_rms_epsilon")),
        )
        # The whole file as bytes: offsets below are absolute file offsets.
        self.map = np.asarray(reader.data).reshape(-1).view(np.uint8)
        self.tensors: dict[str, tuple[int, QT, tuple[int, ...]]] = {}
        for t in reader.tensors:
            shape = tuple(int(s) for s in reversed(t.shape.tolist()))
            self.tensors[t.name] = (int(t.data_offset), t.tensor_type, shape)
        self.max_ctx = int(max_ctx)
        self.reset()

    # -- weights -----------------------------------------------------------
    def off(self, name: str, qtype: QT | None = None, shape: tuple[int, ...] | None = None) -> int:
        """Byte offset of a tensor, checking its type and shape when given."""
        if name not in self.tensors:
            raise KeyError(f"tensor {name} is not in {self.path}")
        o, qt, sh = self.tensors[name]
        if qtype is not None and qt != qtype:
            raise ValueError(f"{name} is {qt.name}, the engine expects {qtype.name}")
        if shape is not None and sh != tuple(shape):
            raise ValueError(f"{name} has shape {sh}, the engine expects {tuple(shape)}")
        if o + tensor_bytes(qt, sh) > self.map.size:
            raise ValueError(f"{name} runs past the end of the file")
        return o

    # -- state -------------------------------------------------------------
    def reset(self) -> None:
        hp = self.hp
        self.k_cache = [np.zeros((self.max_ctx, hp.head_dim), np.float32) for _ in range(hp.n_layer)]
        self.v_cache = [np.zeros((self.max_ctx, hp.head_dim), np.float32) for _ in range(hp.n_layer)]
        self.n_past = 0

    # -- forward -----------------------------------------------------------
    def forward(self, tokens, pos0: int | None = None, trace: Trace | None = None) -> np.ndarray:
        """Runs n tokens at positions pos0.. (default: after the cached ones),
        fills the KV caches and returns the float32 logits of the last row."""
        hp, M = self.hp, self.map
        tok = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = int(tok.size)
        pos0 = self.n_past if pos0 is None else int(pos0)
        if n == 0 or pos0 + n > self.max_ctx:
            raise ValueError(f"{n} tokens at {pos0} do not fit a context of {self.max_ctx}")
        E, H, D, F, X = hp.n_embd, hp.n_head, hp.head_dim, hp.n_ff, hp.n_expert
        scale = 1.0 / math.sqrt(D)

        h = ops.embed_rows(tok, M, self.off("token_embd.weight", QT.F16, (hp.n_vocab, E)), hp.n_vocab, E, n)
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            xn = ops.rms_norm_weight_rows(h, M, self.off(b + "attn_norm.weight", QT.F32, (E,)), E, n, hp.eps)
            q = ops.matmul_q8_0(M, self.off(b + "attn_q.weight", QT.Q8_0, (H * D, E)), E, H * D, xn, n)
            k = ops.matmul_q8_0(M, self.off(b + "attn_k.weight", QT.Q8_0, (D, E)), E, D, xn, n)
            v = ops.matmul_q8_0(M, self.off(b + "attn_v.weight", QT.Q8_0, (D, E)), E, D, xn, n)
            q = ops.rms_norm_plain_rows(q, D, n * H, hp.eps)
            k = ops.rms_norm_plain_rows(k, D, n, hp.eps)
            q = ops.rope_tail(q, n, H, D, hp.n_rot, pos0, hp.freq_base)
            k = ops.rope_tail(k, n, 1, D, hp.n_rot, pos0, hp.freq_base)
            self.k_cache[il][pos0:pos0 + n] = k.reshape(n, D)
            self.v_cache[il][pos0:pos0 + n] = v.reshape(n, D)
            att = ops.attention_window(q, self.k_cache[il][:pos0 + n], self.v_cache[il][:pos0 + n], M,
                                       self.off(b + "attn_sinks.weight", QT.F32, (H,)),
                                       n, pos0, H, D, hp.window, scale)
            o = ops.matmul_q8_0(M, self.off(b + "attn_output.weight", QT.Q8_0, (E, H * D)), H * D, E, att, n)
            h = ops.add(h, o, n * E).reshape(n, E)
            xn = ops.rms_norm_weight_rows(h, M, self.off(b + "ffn_norm.weight", QT.F32, (E,)), E, n, hp.eps)
            r = ops.matmul_f16(M, self.off(b + "ffn_gate_inp.weight", QT.F16, (X, E)), E, X, xn, n)
            ids, w = ops.router_topk(r, X, n, hp.top_k)
            gate, up = ops.routed_gate_up_iq2_xxs(
                M, self.off(b + "ffn_gate_exps.weight", QT.IQ2_XXS, (X, F, E)),
                self.off(b + "ffn_up_exps.weight", QT.IQ2_XXS, (X, F, E)),
                E, F, X, xn, ids, n, hp.top_k)
            mid = ops.swiglu(gate, up, n * hp.top_k * F)
            moe = ops.routed_down_q2_k(M, self.off(b + "ffn_down_exps.weight", QT.Q2_K, (X, E, F)),
                                       F, E, X, mid, ids, w, n, hp.top_k)
            h = ops.add(h, moe, n * E).reshape(n, E)
            if trace is not None:
                trace.h_rms.append(float(np.sqrt(np.mean(h.astype(np.float64) ** 2))))
                trace.expert_ids.append(ids)
        hn = ops.rms_norm_weight_rows(h[n - 1], M, self.off("output_norm.weight", QT.F32, (E,)), E, 1, hp.eps)
        logits = ops.matmul_q8_0(M, self.off("output.weight", QT.Q8_0, (hp.n_vocab, E)), E, hp.n_vocab, hn, 1)[0]
        self.n_past = pos0 + n
        if trace is not None:
            trace.logits = logits
        return logits

    def generate(self, prompt, n_decode: int, traces: list | None = None) -> list[int]:
        """Greedy: prefill ``prompt`` at 0, then n_decode single-token steps.
        Returns n_decode + 1 tokens (argmax ties go to the lower token id)."""
        self.reset()
        out: list[int] = []
        tr = Trace() if traces is not None else None
        logits = self.forward(prompt, 0, tr)
        if traces is not None:
            traces.append(tr)
        out.append(int(np.argmax(logits)))
        for _ in range(int(n_decode)):
            tr = Trace() if traces is not None else None
            logits = self.forward([out[-1]], None, tr)
            if traces is not None:
                traces.append(tr)
            out.append(int(np.argmax(logits)))
        return out


def greedy_tokens(path, prompt, n_decode: int) -> list[int]:
    """Convenience: ``MiniMoeModel(path).generate(prompt, n_decode)``."""
    return MiniMoeModel(path).generate(prompt, n_decode)
