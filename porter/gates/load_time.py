"""Host code a unit's object would run when its library is loaded, read from the object file.

Every library porter links is loaded by processes that judge or run other units:
the parity runner of every later unit linked the committed ones, and the e2e
engine loads them all.  Code that runs at load time runs before any of them is
called, so a unit could patch its neighbours (make a no-op pass, an honest one
fail) without ever being called.  No ported unit may have any: the build gate
refuses an object that carries any of

  - an entry in `.init_array` other than the one nvcc appends to every file
    (`__sti____cudaRegisterAll`, which registers the file's fatbinary), however
    the entry got there (a constructor attribute, a C++ dynamic initialiser, a
    pointer placed in the section by hand or by assembler);
  - any other section the loader runs: `.preinit_array`, `.init`, `.fini`,
    `.fini_array`, `.ctors`, `.dtors` (and their `.name.*` variants, which the
    linker merges into them), by name or by section type;
  - a GNU indirect function (its resolver runs while the library is relocated);
  - a definition of a name of CUDA's registration code (`__cuda*`, `__nv*`,
    `__sti*` with external linkage): nvcc's appended constructor calls those by
    name, and a unit defining one would be called by it.

The static gate refuses the text that makes these (and macro definitions of
reserved names, which could rewrite nvcc's appended code); this is the check on
what the compiler actually made, so token pasting or assembly cannot get past.
It reads 64-bit little-endian ELF relocatable objects (x86-64, aarch64 Linux),
what nvcc -c writes; a file it cannot read is refused, never waved through.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from porter.gates.elf_exports import _SECTION, _SYMBOL

ET_REL = 1
SHT_SYMTAB, SHT_RELA, SHT_NOBITS = 2, 4, 8
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
STT_FUNC, STT_SECTION, STT_GNU_IFUNC = 2, 3, 10
STB_LOCAL = 0
SHN_UNDEF = 0
_RELA = struct.Struct("<QQq")  # Elf64_Rela
# R_X86_64_64, R_AARCH64_ABS64: the absolute address an .init_array slot holds
_ABS64 = {1, 257}

_LOADER_SECTION = re.compile(r"^\.(init_array|fini_array|preinit_array|ctors|dtors)(\..*)?$|^\.(init|fini)$")
# nvcc's appended registration constructor: a file-static function, C++-mangled in a .cu file
NVCC_REGISTRATION = re.compile(r"^(?:_ZL\d+)?__sti____cudaRegisterAll(?:v)?$")
_REGISTRATION_NAMES = re.compile(r"^(__cuda|__nv|__sti)")


class NotReadable(Exception):
    """Not a 64-bit little-endian ELF relocatable object."""


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: int
    bind: int
    shndx: int
    value: int


def problems(obj: Path) -> list[str]:
    """What in `obj` would run at load time (or be run by nvcc's registration code); [] when nothing.
    A file this reader does not walk is one problem, so the caller refuses it."""
    try:
        data = Path(obj).read_bytes()
        return _check(data)
    except (NotReadable, struct.error, IndexError, UnicodeDecodeError, OSError) as exc:
        return [f"cannot read {Path(obj).name} as an ELF object to check it for load-time code ({exc})"]


def _sections(data: bytes) -> tuple[list[tuple], int]:
    """(section headers, index of the section-name table) of a 64-bit little-endian relocatable object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotReadable("not a 64-bit little-endian ELF file")
    e_type, = struct.unpack_from("<H", data, 0x10)
    if e_type != ET_REL:
        raise NotReadable(f"ELF type {e_type}, not a relocatable object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shentsize != _SECTION.size:
        raise NotReadable("no section headers of the 64-bit size")
    if shnum == 0:  # extended numbering: the count is in section 0's sh_size
        shnum = _SECTION.unpack_from(data, shoff)[5]
    sections = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    if shstrndx == 0xFFFF:
        shstrndx = sections[0][6]
    return sections, shstrndx


def section_table(data: bytes) -> list[tuple[bytes, int, int, int, bytes, int]]:
    """(name, type, flags, index, content, size) of each section of a 64-bit little-endian relocatable
    object (NotReadable for anything else); a NOBITS section's content is empty."""
    sections, shstrndx = _sections(data)
    names_off = sections[shstrndx][4]
    out = []
    for i, (nm, typ, flags, _addr, off, size, *_rest) in enumerate(sections):
        start = names_off + nm
        out.append((data[start:data.index(b"\0", start)], typ, flags, i,
                    b"" if typ == SHT_NOBITS else data[off:off + size], size))
    return out


def _check(data: bytes) -> list[str]:
    sections, shstrndx = _sections(data)
    names_off = sections[shstrndx][4]
    names = [_cstr(data, names_off + s[0]) for s in sections]
    symbols = _symbols(data, sections)

    out = []
    allowed = 0
    for i, (sec, name) in enumerate(zip(sections, names)):
        sh_type, size = sec[1], sec[5]
        runs = _LOADER_SECTION.match(name) or sh_type in (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY)
        if not runs or size == 0:
            continue
        if name != ".init_array" or sh_type != SHT_INIT_ARRAY:
            out.append(f"section {name} (code the loader runs)")
            continue
        for slot, target in _slots(data, sections, symbols, i, size):
            if target is not None and NVCC_REGISTRATION.match(target) and allowed == 0:
                allowed += 1
                continue
            out.append(f".init_array entry {slot}: {target or 'an address no function symbol names'} "
                       "runs when the library is loaded")
    for s in symbols:
        if s.kind == STT_GNU_IFUNC:
            out.append(f"indirect function {s.name} (its resolver runs while the library is loaded)")
        elif s.shndx != SHN_UNDEF and s.bind != STB_LOCAL and _REGISTRATION_NAMES.match(s.name):
            out.append(f"defines {s.name}, a name CUDA's registration code calls")
    return out


def _symbols(data: bytes, sections) -> list[Symbol]:
    tabs = [s for s in sections if s[1] == SHT_SYMTAB]
    if len(tabs) != 1:
        raise NotReadable(f"{len(tabs)} symbol tables")
    _, _, _, _, off, size, link, _, _, entsize = tabs[0]
    if entsize != _SYMBOL.size:
        raise NotReadable("a symbol table of another layout")
    str_off = sections[link][4]
    out = []
    for i in range(size // entsize):
        name_at, info, _, shndx, value, _ = _SYMBOL.unpack_from(data, off + i * entsize)
        out.append(Symbol(_cstr(data, str_off + name_at), info & 0xF, info >> 4, shndx, value))
    return out


def _slots(data: bytes, sections, symbols: list[Symbol], index: int, size: int):
    """(slot, the function the slot points to) for each 8-byte slot of section `index`: in an object the
    slot's address is a relocation (against the function, or its section plus the function's offset)."""
    relocs = {}
    for rs in sections:
        if rs[1] != SHT_RELA or rs[7] != index:
            continue
        for k in range(rs[5] // _RELA.size):
            r_offset, r_info, addend = _RELA.unpack_from(data, rs[4] + k * _RELA.size)
            relocs[r_offset] = (r_info >> 32, r_info & 0xFFFFFFFF, addend)
    for slot in range(size // 8):
        rel = relocs.get(slot * 8)
        if rel is None or rel[1] not in _ABS64 or rel[0] >= len(symbols):
            yield slot, None
            continue
        sym = symbols[rel[0]]
        if sym.kind == STT_SECTION:
            hit = [s for s in symbols if s.kind == STT_FUNC and s.shndx == sym.shndx and s.value == rel[2]]
            yield slot, hit[0].name if len(hit) == 1 else None
        else:
            yield slot, sym.name if sym.kind == STT_FUNC and rel[2] == 0 else None


def _cstr(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode()


def undefined_symbols(obj: Path) -> set[str]:
    """The names `obj` uses and does not define (what the link must find in another object)."""
    data = Path(obj).read_bytes()
    sections, _ = _sections(data)
    return {s.name for s in _symbols(data, sections) if s.shndx == SHN_UNDEF and s.bind != STB_LOCAL and s.name}
