"""Weights for a parity case, by GGUF tensor name: the user's model or synthetic stand-ins.

A spec shape whose source is "model:<name>,<name>..." asks for those tensors
(one `Want` each, in the same order).  `place` lays them out in one model map:

* with a model file (the user's GGUF): the real bytes of each named tensor,
  of its real type, checked against the shape the case needs;
* without one: random valid blocks of the census type the Want names.

Expert tensors (3-D, [n_expert][rows][cols]) are large (ds4's routed experts:
256 experts of 2-3 MB each, 1.8 GB for gate, up and down), and a case reads
only the experts it selects, so only those experts get bytes.  A map larger
than SPARSE_MIN is a sparse file (holes read as zeros) that the parity child
reads itself; a smaller one is an in-memory array whose every other byte is
random (reading a wrong offset or expert then shows as garbage, often
non-finite).  Offsets depend only on the tensors' sizes, so both seeds of a
case share one layout.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from porter.errors import PorterError
from porter.target.gguf_file import model_file_problem, unreadable

SPARSE_MIN = 256 << 20  # bytes: larger maps become sparse files
ALIGN = 32
LEAD = 160
GAP = 8192  # between tensors: no host page holds bytes of two tensors (ds4's GGUF keeps them apart too)


class WeightsError(PorterError):
    pass


@dataclass(frozen=True)
class Want:
    """One weight tensor a case needs: its census type and row-major element shape.
    `experts` (3-D tensors only): the experts that must hold real blocks.
    `types`: the types a model's tensor may have (default: qtype only)."""

    qtype: str
    shape: tuple[int, ...]
    experts: tuple[int, ...] | None = None
    types: tuple[str, ...] = ()
    scale: float | None = None  # value scale of synthetic blocks (default 1/sqrt(cols))

    def accepts(self, qtype: str) -> bool:
        return qtype in (self.types or (self.qtype,))


@dataclass(frozen=True)
class Placed:
    """Where a tensor landed: offset in the map, its type, row and expert strides."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    row_bytes: int
    expert_bytes: int  # 0 for a 2-D tensor
    real: bool  # bytes from the user's model


@dataclass(frozen=True)
class ModelTensor:
    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class ModelFile:
    """A GGUF file's tensor directory (gguf-py's reader maps the file; nothing is read eagerly)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        problem = model_file_problem(self.path)
        if problem:
            raise WeightsError(problem)
        import gguf

        try:
            r = gguf.GGUFReader(str(self.path))
        except Exception as exc:  # noqa: BLE001 - a bad file is one clear error
            raise WeightsError(unreadable(self.path, exc)) from None
        self.tensors = {}
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
            self.tensors[t.name] = ModelTensor(t.name, t.tensor_type.name, shape, int(t.data_offset), int(t.n_bytes))
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")

    def tensor(self, name: str) -> ModelTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(f"model {self.path.name} has no tensor {name!r}") from None

    def bytes(self, offset: int, n: int) -> np.ndarray:
        return self._mm[offset:offset + n]


def _row_bytes(qtype: str, cols: int) -> int:
    from reference import quant

    return quant.row_bytes(qtype, cols)


def place(wants: list[Want], names: list[str], rng: np.random.Generator, model: ModelFile | None = None,
          scratch: Path | None = None):
    """(bytes, file, [Placed]) for the wanted tensors, real (model given) or synthetic: the map's
    bytes (a read-only memmap of `file` when sparse, else an in-memory array with file None)."""
    from reference import quant

    if len(names) != len(wants):
        raise WeightsError(f"the shape names {len(names)} tensors, its builder wants {len(wants)}")
    metas = []
    for name, w in zip(names, wants):
        qtype, real = w.qtype, False
        if model is not None:
            t = model.tensor(name)
            if tuple(t.shape) != tuple(w.shape):
                raise WeightsError(f"model tensor {name} is {t.shape}, the case needs {tuple(w.shape)}")
            # a tensor of a type this unit does not read (e.g. an F16 mtp.0.hc_head_fn for the F32
            # matmul) is not this unit's input in that model: the case keeps a synthetic stand-in
            if w.accepts(t.qtype):
                qtype, real = t.qtype, True
        rb = _row_bytes(qtype, w.shape[-1])
        per = rb * w.shape[-2] if len(w.shape) == 3 else 0
        metas.append((name, w, qtype, real, rb, per, rb * prod(w.shape[:-1])))
    offsets, pos = [], LEAD
    for m in metas:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        offsets.append(pos)
        pos += m[6] + GAP
    size = (pos + ALIGN - 1) // ALIGN * ALIGN

    sparse = size > SPARSE_MIN
    if sparse:
        if scratch is None:
            raise WeightsError("a sparse weight map needs a scratch folder")
        fd, path = tempfile.mkstemp(prefix="weights-", suffix=".map", dir=scratch)
        f = open(fd, "r+b")
        f.truncate(size)

        def put(off, data):
            f.seek(off)
            f.write(np.ascontiguousarray(data).reshape(-1).view(np.uint8).tobytes())
    else:
        buf = rng.integers(0, 256, size, dtype=np.uint8)

        def put(off, data):
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            buf[off:off + raw.size] = raw

    placed = []
    for (name, w, qtype, real, rb, per, nbytes), off in zip(metas, offsets):
        if len(w.shape) == 3:
            experts = sorted(set(int(e) for e in (w.experts if w.experts is not None else range(w.shape[0]))))
            for e in experts:
                if not 0 <= e < w.shape[0]:
                    raise WeightsError(f"{name}: expert {e} outside 0..{w.shape[0] - 1}")
                if real:
                    t = model.tensor(name)
                    put(off + e * per, model.bytes(t.offset + e * per, per))
                else:
                    put(off + e * per, quant.random_blocks(qtype, w.shape[1], w.shape[2], rng, w.scale))
        else:
            if real:
                t = model.tensor(name)
                put(off, model.bytes(t.offset, nbytes))
            else:
                put(off, quant.random_blocks(qtype, prod(w.shape[:-1]), w.shape[-1], rng, w.scale))
        placed.append(Placed(name, qtype, tuple(w.shape), off, rb, per, real))
    if sparse:
        f.close()
        return np.memmap(path, dtype=np.uint8, mode="r"), path, placed
    return buf, None, placed
