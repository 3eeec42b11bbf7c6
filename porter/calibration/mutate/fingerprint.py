"""What an object file runs, as one digest: two objects with the same digest hold the same machine code.

The build gate's objects are not byte-for-byte comparable between two sources even when nvcc made the
same code of both: each object's module id (`_<hex>_<len>_<unit>_cu_<hex>`, porter.gates.nvcc_split;
nvcc's own has the same shape) differs with its source, it names the unit's internal symbols on the host
and on the device, and the device code inside the fatbinary is zstd-compressed, so one changed name
changes every byte after it.  The digest therefore reads:

- the host object's sections (ELF64), each by name, type, flags and content, with the module id masked
  (in names too: a per-symbol section is named after its symbol);
  the symbol table's sizes of symbols in the fatbinary's section dropped (a compressed size);
- the fatbinary's entries (`.nv_fatbin`): for each architecture its cubins (the machine code the GPU
  runs), decompressed where compressed, module id masked; the PTX of an architecture only where it has
  no cubin (then the driver compiles that PTX, so it is what runs).

Where libzstd cannot be loaded, a compressed entry is read as it is: objects that differ only in the id
then read as different, never the reverse (a mutant is run, not called equivalent).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import re
import struct
from functools import lru_cache
from pathlib import Path

from porter.gates import load_time

FATBIN_MAGIC = 0xBA55ED50
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FATBIN_SECTION = b".nv_fatbin"
KIND_PTX, KIND_ELF = 1, 2
SHT_SYMTAB, SHT_NOBITS = 2, 8


def module_id_pattern(unit: str) -> re.Pattern:
    """nvcc's module id of a file named `unit`.cu: `_<8 hex>_<len>_<stem>_cu_<8 hex>` (a mangled name may follow
    it directly with its length's digits, which are code, not id)."""
    return re.compile(rb"_[0-9a-f]{8}_[0-9]+_" + re.escape(re.sub(r"[^A-Za-z0-9_]", "_", unit).encode())
                      + rb"_cu_[0-9a-f]{8}")


def mask(data: bytes, unit: str) -> bytes:
    """`data` with every module id of `unit` replaced by as many 'M's (offsets and sizes unchanged)."""
    return module_id_pattern(unit).sub(lambda m: b"M" * len(m.group(0)), data)


@lru_cache(maxsize=1)
def _zstd():
    name = ctypes.util.find_library("zstd")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.ZSTD_findFrameCompressedSize.restype = ctypes.c_size_t
    lib.ZSTD_findFrameCompressedSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    return lib


def zstd_available() -> bool:
    return _zstd() is not None


def decompress(payload: bytes) -> bytes | None:
    """The content of the zstd frame `payload` starts with; None when it is not one or libzstd is absent."""
    lib = _zstd()
    if lib is None or not payload.startswith(ZSTD_MAGIC):
        return None
    size = lib.ZSTD_findFrameCompressedSize(payload, len(payload))
    if lib.ZSTD_isError(size):
        return None
    want = lib.ZSTD_getFrameContentSize(payload, size)
    if want >= (1 << 63) or want > 1 << 30:  # unknown or error (the top values), or absurd
        return None
    out = ctypes.create_string_buffer(max(1, want))
    got = lib.ZSTD_decompress(out, want, payload, size)
    if lib.ZSTD_isError(got):
        return None
    return out.raw[:got]


def fatbin_entries(blob: bytes) -> list[tuple[int, int, bytes]]:
    """(kind, architecture, payload as it runs: decompressed where it was compressed) of each entry of
    every fatbinary in `blob`; [] where `blob` does not read as one."""
    out = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            break
        p, end = pos + header, min(len(blob), pos + header + size)
        while p + 32 <= end:
            kind, _v, entry_header, payload_size = struct.unpack_from("<HHIQ", blob, p)
            if entry_header < 32 or p + entry_header > end:
                break
            arch = struct.unpack_from("<I", blob, p + 28)[0]
            payload = blob[p + entry_header:p + entry_header + payload_size]
            out.append((kind, arch, decompress(payload) or payload))
            p += entry_header + payload_size
        pos = (pos + header + size + 7) & ~7  # several fatbinaries are laid one after another, aligned
    return out


def _sections(data: bytes) -> list[tuple[bytes, int, int, int, bytes, int]]:
    """The build gate's reading of an object's sections (porter.gates.load_time.section_table); [] for
    anything it does not read as a relocatable ELF64 object."""
    try:
        return load_time.section_table(data)
    except (load_time.NotReadable, struct.error, IndexError, ValueError):
        return []


def _symtab_without_sizes_in(content: bytes, section_index: int) -> bytes:
    """A symbol table with st_size zeroed for the symbols defined in one section."""
    out = bytearray(content)
    for at in range(0, len(out) - 23, 24):
        shndx = struct.unpack_from("<H", out, at + 6)[0]
        if shndx == section_index:
            struct.pack_into("<Q", out, at + 16, 0)
    return bytes(out)


def digest_bytes(data: bytes, unit: str) -> str:
    """The digest of an object's machine code (see the module's doc); any file that is not an ELF64
    object is digested as its masked bytes."""
    h = hashlib.sha256()
    sections = _sections(data)
    if not sections:
        h.update(mask(data, unit))
        return h.hexdigest()
    fatbin_index = next((i for name, _t, _f, i, _c, _s in sections if name == FATBIN_SECTION), -1)
    for name, typ, flags, _i, content, size in sections:
        # a section of its own per symbol (`.rodata.<mangled name>`: libcu++'s anonymous-namespace
        # `cuda::std::ignore`, which every ds4 slice includes) carries the module id in its name
        h.update(mask(name, unit) + b"\0" + struct.pack("<IQ", typ, flags))
        if name == FATBIN_SECTION:
            entries = fatbin_entries(content)
            with_cubin = {arch for kind, arch, _p in entries if kind == KIND_ELF}
            for kind, arch, payload in entries:
                if kind == KIND_ELF or arch not in with_cubin:
                    h.update(struct.pack("<HI", kind, arch) + hashlib.sha256(mask(payload, unit)).digest())
            if not entries:
                h.update(hashlib.sha256(mask(content, unit)).digest())
            continue
        if typ == SHT_SYMTAB and fatbin_index >= 0:
            content = _symtab_without_sizes_in(content, fatbin_index)
        h.update(struct.pack("<Q", size if typ == SHT_NOBITS else 0) + hashlib.sha256(mask(content, unit)).digest())
    return h.hexdigest()


def digest(path: Path, unit: str) -> str:
    return digest_bytes(Path(path).read_bytes(), unit)
