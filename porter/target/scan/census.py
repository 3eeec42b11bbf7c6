"""GGUF census: which tensor types the model file really has, and what each unit needs for it.

The header (metadata and tensor infos) is read with gguf.GGUFReader over a
memory map; tensor data is never touched: the reader subclass below records
each tensor's name, type, shape, size and offset without building the data
views, so a header-only file (the tensor data cut off) gives the same census.

A target's census table maps tensor-name patterns to the units that read
those tensors and the GGML types the engine expects there:

    [[census.rule]]                      # in target.toml (or targets/<t>/census.toml as [[rule]])
    pattern = "blk.*.ffn_gate_exps.weight"   # glob on the tensor name (or a list): * within one dotted part
    units = ["ds4_gpu_routed_moe_batch_tensor", "ds4_gpu_routed_moe_one_tensor"]
    expect = ["IQ2_XXS", "Q2_K", "Q4_K"]     # types the units read correctly; [] = any
    role = "routed expert gate"

A table may also name the model files the engine knows as whole-file variants
(ds4: the 2-bit download with IQ2_XXS gate/up and Q2_K down experts, and the
high-memory one with Q4_K experts); the census says which one a file is, or
why it is none of them (a mix the engine refuses, e.g. gate and up of
different types):

    [[variant]]                          # targets/<t>/census.toml
    name = "q4"
    role = "Q4_K routed experts (high-memory variant)"
    types = {"**.ffn_gate_exps.weight" = "Q4_K", "**.ffn_up_exps.weight" = "Q4_K", "**.ffn_down_exps.weight" = "Q4_K"}

For each unit: the quant variants this file requires (types of the tensors
mapped to it), the variants it has code for that this file does not contain
("absent": the unit's `expect` types and the quant types named by its Metal
kernels), and flags where a tensor's type is not one the units expect (an
abliterated/requantised GGUF with Q8_0 where ds4 reads F16: those units would
refuse or misread it).
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from porter.errors import PorterError
from porter.target.gguf_file import check_model_file, unreadable

_QUANT_TOKEN = re.compile(r"(?<![A-Za-z0-9])(iq\d_(?:xxs|xs|s|m|nl)|q\d_[01k]|q\d_k)(?![A-Za-z0-9])", re.I)


@dataclass(frozen=True)
class CensusRule:
    pattern: str | tuple[str, ...]  # one glob or several
    units: tuple[str, ...]
    expect: tuple[str, ...] = ()
    role: str = ""

    @property
    def patterns(self) -> tuple[str, ...]:
        return (self.pattern,) if isinstance(self.pattern, str) else tuple(self.pattern)

    def matches(self, name: str) -> bool:
        return any(glob_regex(p).match(name) for p in self.patterns)

    @property
    def label(self) -> str:
        return " | ".join(self.patterns)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str  # GGML type name: F32 F16 Q8_0 Q2_K IQ2_XXS ...
    ne: tuple[int, ...]  # GGUF order: ne[0] is the innermost (row length)
    n_bytes: int
    offset: int  # absolute byte offset of the data in the file

    @property
    def shape(self) -> tuple[int, ...]:
        """Outermost first ([n_expert][out][in]), as targets/minimoe/README.md writes shapes."""
        return tuple(reversed(self.ne))


@dataclass(frozen=True)
class CensusFlag:
    tensor: str
    type: str
    expected: tuple[str, ...]
    units: tuple[str, ...]
    pattern: str
    message: str


@dataclass(frozen=True)
class CensusVariant:
    """A kind of model file the engine knows: every tensor matching a pattern has that pattern's type."""

    name: str
    types: tuple[tuple[str, str], ...]  # (tensor-name glob, GGML type)
    role: str = ""

    def mismatches(self, tensors) -> tuple[int, list[str]]:
        """(tensors the variant speaks about, one line per tensor of another type)."""
        seen, bad = 0, []
        for t in tensors:
            for pat, typ in self.types:
                if glob_regex(pat).match(t.name):
                    seen += 1
                    if t.type != typ:
                        bad.append(f"{t.name} is {t.type}, {typ} expected")
                    break
        return seen, bad


@dataclass
class UnitCensus:
    unit: str
    required: dict[str, int] = field(default_factory=dict)  # type -> number of tensors of that type
    examples: dict[str, str] = field(default_factory=dict)  # type -> one tensor name
    absent: list[str] = field(default_factory=list)  # variants the unit has that the file does not need
    flags: list[str] = field(default_factory=list)
    bytes: int = 0  # weight bytes this unit reads from the file

    @property
    def relevance(self) -> int:
        return sum(self.required.values())


@dataclass
class Census:
    path: str
    architecture: str | None
    tensor_count: int
    types: dict[str, int]
    tensors: list[TensorInfo]
    units: dict[str, UnitCensus]
    flags: list[CensusFlag]
    unmatched: list[str]
    header_only: bool  # tensor data lies beyond the end of the file (a header-only/truncated file)
    rules_source: str = ""
    variant: str | None = None  # the known model variant this file is, when the table names variants
    variant_notes: list[str] = field(default_factory=list)  # why it is none of them

    def unit(self, name: str) -> UnitCensus | None:
        return self.units.get(name)


@functools.lru_cache(maxsize=None)
def glob_regex(pattern: str) -> re.Pattern:
    """Tensor-name glob: `*` stays inside one dot-separated part (blk.*.attn_q_b.weight does not match
    blk.2.indexer.attn_q_b.weight), `**` crosses dots, `?` is one character, [..] a class."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^.]*"
        elif c == "?":
            out += "[^.]"
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out += re.escape(c)
            else:
                body = pattern[i + 1 : j]
                out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def quant_types_in(names) -> list[str]:
    """Quant block types named by kernel names (kernel_mul_mv_id_q2_K_f32 -> Q2_K), first-seen order."""
    out: list[str] = []
    for n in names:
        for m in _QUANT_TOKEN.finditer(n):
            t = m.group(1).upper()
            if t not in out:
                out.append(t)
    return out


# ---------------------------------------------------------------- header


def read_header(path: str | Path) -> tuple[str | None, list[TensorInfo], bool]:
    """(architecture, tensors, header_only) from the GGUF header; tensor data is never read."""
    import gguf
    import numpy as np

    class _HeaderReader(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):  # noqa: D401 - replaces the data views
            infos = []
            for f in fields:
                _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = f.parts
                gtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                ne = tuple(int(d) for d in dims.tolist())
                n_elems = int(np.prod(ne)) if ne else 1
                block, tsize = gguf.GGML_QUANT_SIZES[gtype]
                infos.append(TensorInfo(
                    name=bytes(name_data).decode("utf-8", "replace"),
                    type=gtype.name,
                    ne=ne,
                    n_bytes=n_elems * tsize // block,
                    offset=int(start_offs + int(offset_tensor[0])),
                ))
            self.tensors = []
            self.porter_tensors = infos

    path = check_model_file(path)
    try:
        reader = _HeaderReader(str(path))
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise PorterError(unreadable(path, exc)) from exc
    arch = None
    f = reader.get_field("general.architecture")
    if f is not None:
        try:
            arch = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
        except (IndexError, TypeError):
            arch = None
    size = os.path.getsize(path)
    tensors = reader.porter_tensors
    header_only = any(t.offset + t.n_bytes > size for t in tensors)
    del reader
    return arch, tensors, header_only


# ---------------------------------------------------------------- rules


def load_rules(target) -> tuple[list[CensusRule], str]:
    """The target's census table: target.toml [census], else targets/<t>/census.toml."""
    toml_path = Path(target.dir) / "target.toml"
    sources = []
    try:
        raw = tomllib.loads(toml_path.read_text())
        if isinstance(raw.get("census"), dict):
            sources.append((raw["census"].get("rule", []), f"{toml_path} [census]"))
    except (OSError, tomllib.TOMLDecodeError):
        pass
    side = Path(target.dir) / "census.toml"
    if not sources and side.is_file():
        try:
            raw = tomllib.loads(side.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise PorterError(f"malformed {side}: {exc}") from exc
        sources.append((raw.get("rule", []), str(side)))
    if not sources:
        return [], "no census table"
    rules_raw, where = sources[0]
    rules = []
    for i, r in enumerate(rules_raw):
        if not isinstance(r, dict) or "pattern" not in r or "units" not in r:
            raise PorterError(f"{where}: rule {i + 1} needs `pattern` and `units`")
        unknown = set(r) - {"pattern", "units", "expect", "role"}
        if unknown:
            raise PorterError(f"{where}: rule {i + 1} has unknown keys {sorted(unknown)}")
        pat = r["pattern"]
        pat = str(pat) if isinstance(pat, str) else tuple(str(x) for x in pat)
        rules.append(CensusRule(pattern=pat, units=tuple(r["units"]), expect=tuple(r.get("expect", ())),
                                role=str(r.get("role", ""))))
    return rules, where


def load_variants(target) -> list[CensusVariant]:
    """[[variant]] tables of targets/<t>/census.toml (none when it has no such table)."""
    side = Path(target.dir) / "census.toml"
    if not side.is_file():
        return []
    try:
        raw = tomllib.loads(side.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PorterError(f"malformed {side}: {exc}") from exc
    out = []
    for i, v in enumerate(raw.get("variant", [])):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("types"), dict) \
                or not v["types"]:
            raise PorterError(f"{side}: variant {i + 1} needs `name` and a non-empty `types` table")
        unknown = set(v) - {"name", "types", "role"}
        if unknown:
            raise PorterError(f"{side}: variant {i + 1} has unknown keys {sorted(unknown)}")
        out.append(CensusVariant(v["name"], tuple((str(p), str(t)) for p, t in v["types"].items()),
                                 str(v.get("role", ""))))
    return out


def which_variant(tensors, variants: list[CensusVariant]) -> tuple[str | None, list[str]]:
    """(the one variant every relevant tensor agrees with, else None and why not)."""
    matched, notes = [], []
    for v in variants:
        seen, bad = v.mismatches(tensors)
        if seen and not bad:
            matched.append(v.name)
        elif not seen:
            notes.append(f"{v.name}: no tensor of this file matches its patterns")
        else:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            notes.append(f"{v.name}: {bad[0]}{more}")
    if len(matched) == 1:
        return matched[0], []
    if matched:
        return None, [f"matches several variants: {', '.join(matched)}"]
    return None, notes


# ---------------------------------------------------------------- the census


def census(model_path: str | Path, rules: list[CensusRule], unit_kernels: dict[str, list[str]] | None = None,
           rules_source: str = "", variants: list[CensusVariant] | None = None) -> Census:
    """Census of a GGUF file against a census table.

    unit_kernels: unit -> Metal kernel names (from the host dispatch map); the
    quant types those names carry are variants of the unit too.
    """
    arch, tensors, header_only = read_header(model_path)
    types: dict[str, int] = {}
    for t in tensors:
        types[t.type] = types.get(t.type, 0) + 1
    units: dict[str, UnitCensus] = {}

    def uc(u: str) -> UnitCensus:
        if u not in units:
            units[u] = UnitCensus(unit=u)
        return units[u]

    universe: dict[str, list[str]] = {}
    for r in rules:
        for u in r.units:
            uc(u)
            for e in r.expect:
                universe.setdefault(u, [])
                if e not in universe[u]:
                    universe[u].append(e)
    for u, ks in (unit_kernels or {}).items():
        qs = quant_types_in(ks)
        if qs:
            uc(u)
            for q in qs:
                universe.setdefault(u, [])
                if q not in universe[u]:
                    universe[u].append(q)

    flags: list[CensusFlag] = []
    unmatched: list[str] = []
    for t in tensors:
        hit = [r for r in rules if r.matches(t.name)]
        if not hit:
            unmatched.append(t.name)
            continue
        for r in hit:
            ok = not r.expect or t.type in r.expect
            for u in r.units:
                c = uc(u)
                if ok:
                    c.required[t.type] = c.required.get(t.type, 0) + 1
                    c.examples.setdefault(t.type, t.name)
                    c.bytes += t.n_bytes
            if not ok:
                msg = (f"{t.name} is {t.type}, {'/'.join(r.expect)} expected"
                       f"{' (' + r.role + ')' if r.role else ''}: {', '.join(r.units)} would refuse or misread it")
                flags.append(CensusFlag(tensor=t.name, type=t.type, expected=r.expect, units=r.units, pattern=r.label,
                                        message=msg))
                for u in r.units:
                    c = uc(u)
                    line = f"{t.type} where {'/'.join(r.expect)} is expected ({r.label})"
                    if line not in c.flags:
                        c.flags.append(line)
    for u, c in units.items():
        c.absent = [q for q in universe.get(u, []) if q not in c.required]
    variant, variant_notes = which_variant(tensors, variants) if variants else (None, [])
    return Census(
        path=str(model_path),
        architecture=arch,
        tensor_count=len(tensors),
        types=dict(sorted(types.items())),
        tensors=tensors,
        units=units,
        flags=flags,
        unmatched=unmatched,
        header_only=header_only,
        rules_source=rules_source,
        variant=variant,
        variant_notes=variant_notes,
    )
