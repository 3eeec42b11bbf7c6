"""The names a shared library's dynamic symbol table defines, read from the file.

The build gate asks this of every library it links (each API function must be
exported under its C name).  It used to ask `nm -D --defined-only`, whose
process start was 20-30 ms of every build verdict; the answer is a walk over
one section.  Only the layout every porter build makes is read here (64-bit
little-endian ELF: x86-64 and aarch64 Linux); for anything else, or a file
that does not read as one, the caller asks nm, so the check never depends on
this reader being right about an odd file.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

SHT_DYNSYM = 11
SHN_UNDEF = 0
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym


class NotReadable(Exception):
    """Not a 64-bit little-endian ELF this reader walks: ask nm."""


def defined_dynamic_symbols(path: Path) -> set[str]:
    """What `nm -D --defined-only` names (without symbol versions): every .dynsym entry whose
    section is not SHN_UNDEF.  Raises NotReadable for a file outside the layout above."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise NotReadable("empty file") from None
    with data:
        try:
            return _walk(data)
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise NotReadable(str(exc)) from None


def _walk(data) -> set[str]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotReadable("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff == 0 or shentsize != _SECTION.size:
        raise NotReadable("no section headers of the 64-bit size")
    if shnum == 0:  # extended numbering: the count is in section 0's sh_size
        shnum = _SECTION.unpack_from(data, shoff)[5]
    sections = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    dynsym = [s for s in sections if s[1] == SHT_DYNSYM]
    if len(dynsym) != 1:
        raise NotReadable(f"{len(dynsym)} dynamic symbol tables")
    _, _, _, _, sym_off, sym_size, link, _, _, entsize = dynsym[0]
    if entsize != _SYMBOL.size or link >= len(sections):
        raise NotReadable("a dynamic symbol table of another layout")
    str_off, str_size = sections[link][4], sections[link][5]
    if sym_off + sym_size > len(data) or str_off + str_size > len(data):
        raise NotReadable("a table past the end of the file")
    names = set()
    for i in range(1, sym_size // entsize):  # entry 0 is the null symbol
        name_at, _, _, shndx, _, _ = _SYMBOL.unpack_from(data, sym_off + i * entsize)
        if shndx == SHN_UNDEF or name_at >= str_size:
            continue
        end = data.find(b"\0", str_off + name_at, str_off + str_size)
        if end < 0:
            raise NotReadable("an unterminated symbol name")
        name = data[str_off + name_at:end].decode()
        if name:
            names.add(name)
    return names
