"""Plays for minimoe's runtime scenarios (mini_gpu.h: tensor lifetime, transfers, ordering).

Each play appends calls and expectations to a Script; each runtime unit's spec
file (mini_gpu_<unit>.py) builds its cases from the plays that exercise it.
The contract is mini_gpu.h's: 0 on success, NULL for a refused allocation or
view; a view aliases [offset, offset+bytes) of its base and freeing it never
frees the base; read/write/synchronize order against everything submitted
before them.  Sizes and offsets are odd on purpose: a stride, rounding or
alignment assumption shows as bytes at the wrong place.
"""
import numpy as np

from porter.spec.scenario import NULL, HostIn, HostOut, Script, T

P = "mini_gpu_"
MiB = 1 << 20


def fn(name: str) -> str:
    return P + name


def image(s: Script, n: int) -> np.ndarray:
    return s.rng.integers(0, 256, n, dtype=np.uint8)


def alloc(s: Script, name: str, n: int) -> np.ndarray:
    """A tensor of n bytes holding fresh random bytes (written whole); returns its image."""
    s.call(fn("tensor_alloc"), n, save=name, expect="ok", why=f"{n} bytes")
    img = image(s, n)
    s.call(fn("tensor_write"), T(name), 0, HostIn(img), n, expect="ok")
    return img


def read_all(s: Script, name: str, want: np.ndarray, region=None, why: str = "", check: str = "exact") -> None:
    s.read(fn("tensor_read"), name, 0, want.size, want, region=region, why=why, check=check)


def start() -> Script:
    return Script()


def play_init(s: Script) -> None:
    s.call(fn("init"), expect="ok", why="a device is present")
    s.call(fn("init"), expect="ok", why="init twice is harmless (the engine and a test harness both call it)")


def play_roundtrip(s: Script, n: int) -> None:
    """Whole write, odd sub-range write, whole and partial reads; bytes outside the write unchanged."""
    img = alloc(s, "rt", n)
    read_all(s, "rt", img, why="a whole write reads back")
    if n >= 3:
        off = 1 + (n // 3) | 1
        off = min(off, n - 1)
        ln = max(1, min(n - off, (n // 2) | 1))
        new = image(s, ln)
        s.call(fn("tensor_write"), T("rt"), off, HostIn(new), ln, expect="ok", why=f"{ln} bytes at odd offset {off}")
        img = img.copy()
        img[off:off + ln] = new
        read_all(s, "rt", img, region=(off, off + ln), why="only the written range changes")
        ro, rl = max(0, off - 1), min(n - max(0, off - 1), ln + 2)
        s.read(fn("tensor_read"), "rt", ro, rl, img[ro:ro + rl], why=f"a read at offset {ro} returns those bytes")
    s.call(fn("tensor_write"), T("rt"), n, HostIn(np.zeros(1, np.uint8)), 0, expect="ok",
           why="0 bytes at the end is a valid write")
    s.call(fn("tensor_free"), T("rt"), expect="ok")


def play_write_errors(s: Script, n: int) -> None:
    """Writes outside a tensor or a view are refused and change nothing."""
    img = alloc(s, "wb", n)
    s.call(fn("tensor_write"), T("wb"), n - 2, HostIn(image(s, 5)), 5, expect="error",
           why="the range runs 3 bytes past the end")
    s.call(fn("tensor_write"), T("wb"), n + 1, HostIn(image(s, 1)), 0, expect="error",
           why="the offset lies past the end")
    s.call(fn("tensor_write"), T("wb"), 2**64 - 2, HostIn(image(s, 4)), 4, expect="error",
           why="offset + bytes overflows 64 bits")
    vo, vn = 37, min(101, n - 40)
    s.call(fn("tensor_view"), T("wb"), vo, vn, save="wv", expect="ok")
    s.call(fn("tensor_write"), T("wv"), vn - 10, HostIn(image(s, 20)), 20, expect="error",
           why="the range runs past the end of the view (though still inside its base)")
    read_all(s, "wb", img, region=(0, 0), why="refused writes change nothing")
    s.call(fn("tensor_free"), T("wv"), expect="ok")
    s.call(fn("tensor_free"), T("wb"), expect="ok")


def play_read_offsets(s: Script, n: int) -> None:
    """Reads at odd offsets and sizes return exactly those bytes; bad ranges are refused."""
    img = alloc(s, "rd", n)
    for off, ln in ((1, 3), (7, 129), (n // 2 | 1, 1), (n - 3, 3), (255, 513)):
        if off + ln <= n:
            s.read(fn("tensor_read"), "rd", off, ln, img[off:off + ln], why=f"{ln} bytes at offset {off}")
    s.call(fn("tensor_read"), T("rd"), n, NULL, 0, expect=None)
    s.read(fn("tensor_read"), "rd", n - 2, 5, np.zeros(5, np.uint8), expect="error",
           why="the range runs past the end")
    s.read(fn("tensor_read"), "rd", n + 3, 1, np.zeros(1, np.uint8), expect="error", why="the offset is past the end")
    s.call(fn("tensor_free"), T("rd"), expect="ok")


def play_view(s: Script, n: int) -> None:
    """A view aliases [offset, offset+bytes) of its base, nests, and refuses ranges outside the base."""
    img = alloc(s, "vb", n).copy()
    vo, vn = 37, n - 37 - 29
    s.call(fn("tensor_view"), T("vb"), vo, vn, save="v", expect="ok", why=f"[{vo}, {vo + vn}) of {n} bytes")
    b = s.call(fn("tensor_bytes"), T("v"), expect=None)
    s.value(b, vn, why="a view's size is the size it was given")
    s.read(fn("tensor_read"), "v", 0, vn, img[vo:vo + vn], why="a view reads its base's bytes at its offset")
    wo, wl = 5, min(201, vn - 5)
    new = image(s, wl)
    s.call(fn("tensor_write"), T("v"), wo, HostIn(new), wl, expect="ok")
    img[vo + wo:vo + wo + wl] = new
    read_all(s, "vb", img, region=(vo + wo, vo + wo + wl), why="a write through a view lands at view offset + offset")
    s.call(fn("tensor_view"), T("v"), 11, 50, save="w", expect="ok", why="a view of a view")
    s.read(fn("tensor_read"), "w", 0, 50, img[vo + 11:vo + 61], why="offsets of nested views add up")
    s.call(fn("tensor_view"), T("vb"), n - 3, 5, save="bad1", expect="error", why="runs past the end of the base")
    s.call(fn("tensor_view"), T("vb"), n + 1, 0, save="bad2", expect="error", why="offset past the end of the base")
    s.call(fn("tensor_view"), T("v"), vn - 1, 2, save="bad3", expect="error", why="runs past the end of the view")
    s.call(fn("tensor_view"), T("vb"), n, 0, save="empty", expect="ok", why="an empty view at the very end is valid")
    for v in ("w", "v", "empty"):
        s.call(fn("tensor_free"), T(v), expect="ok")
    read_all(s, "vb", img, region=(0, 0), why="freeing views leaves the base as it was")
    s.call(fn("tensor_free"), T("vb"), expect="ok")


def play_copy(s: Script, n1: int, n2: int) -> None:
    """Copies between odd ranges of tensors and views; nothing outside the destination range changes.
    The destination is rewritten before each copy, so each read judges one copy only."""
    a = alloc(s, "ca", n1)
    b = alloc(s, "cb", n2).copy()
    do, so, ln = 101, 13, min(517, n1 - 13, n2 - 101)
    s.call(fn("tensor_copy"), T("cb"), do, T("ca"), so, ln, expect="ok", why=f"{ln} bytes, odd offsets")
    b[do:do + ln] = a[so:so + ln]
    read_all(s, "cb", b, region=(do, do + ln), why="the copied range, and nothing else")
    s.call(fn("tensor_view"), T("ca"), 3, n1 - 6, save="va", expect="ok")
    s.call(fn("tensor_view"), T("cb"), n2 // 2, n2 - n2 // 2 - 1, save="vb", expect="ok")
    b = rewrite(s, "cb", n2)
    ln2 = min(255, n1 - 8, n2 - n2 // 2 - 8)
    s.call(fn("tensor_copy"), T("vb"), 7, T("va"), 1, ln2, expect="ok", why="view to view")
    b[n2 // 2 + 7:n2 // 2 + 7 + ln2] = a[4:4 + ln2]
    read_all(s, "cb", b, region=(n2 // 2 + 7, n2 // 2 + 7 + ln2), why="copy between views at their offsets")
    b = rewrite(s, "cb", n2)
    s.call(fn("tensor_copy"), T("cb"), n2 - 1, T("ca"), n1 - 1, 1, expect="ok", why="the last byte")
    b[n2 - 1] = a[n1 - 1]
    read_all(s, "cb", b, region=(n2 - 1, n2), why="a one-byte copy at the very end")
    b = rewrite(s, "cb", n2)
    s.call(fn("tensor_copy"), T("cb"), 0, T("ca"), 0, 0, expect="ok", why="0 bytes")
    s.call(fn("tensor_copy"), T("cb"), 0, T("ca"), n1 - 5, 9, expect="error", why="source range past its end")
    s.call(fn("tensor_copy"), T("cb"), n2 - 5, T("ca"), 0, 9, expect="error", why="destination range past its end")
    s.call(fn("tensor_copy"), T("vb"), 0, T("ca"), 0, n2 - n2 // 2, expect="error",
           why="destination range past the end of the view (inside its base)")
    read_all(s, "cb", b, region=(0, 0), why="refused copies change nothing")
    for t in ("va", "vb", "ca", "cb"):
        s.call(fn("tensor_free"), T(t), expect="ok")


def rewrite(s: Script, name: str, n: int) -> np.ndarray:
    img = image(s, n)
    s.call(fn("tensor_write"), T(name), 0, HostIn(img), n, expect="ok")
    return img.copy()


def play_free(s: Script, n: int) -> None:
    """Freeing a view leaves its base usable; free(NULL) is harmless; alloc/free returns the memory."""
    img = alloc(s, "fb", n).copy()
    s.call(fn("tensor_view"), T("fb"), 21, n - 40, save="fv", expect="ok")
    s.call(fn("tensor_free"), T("fv"), expect="ok")
    s.call(fn("tensor_view"), T("fb"), 0, n - 1, save="f0", expect="ok")
    s.call(fn("tensor_free"), T("f0"), expect="ok")
    new = image(s, 33)
    s.call(fn("tensor_write"), T("fb"), 7, HostIn(new), 33, expect="ok", why="the base after its views were freed")
    img[7:40] = new
    read_all(s, "fb", img, region=(7, 40), why="the base after its views were freed")
    s.call(fn("tensor_free"), T("fb"), expect="ok")
    s.call(fn("tensor_free"), NULL, expect="ok")
    big, times = 32 * MiB + 3, 12
    s.call(fn("tensor_alloc"), big, save="warm", expect="ok")  # first allocation may grow pools: not a leak
    s.call(fn("tensor_free"), T("warm"), expect="ok")
    m0 = s.mem()
    for i in range(times):
        s.call(fn("tensor_alloc"), big, save=f"l{i}", expect="ok")
        s.call(fn("tensor_write"), T(f"l{i}"), big - 8, HostIn(image(s, 8)), 8, expect="ok")
        s.call(fn("tensor_free"), T(f"l{i}"), expect="ok")
    m1 = s.mem()
    s.no_leak(m0, m1, slack=32 * MiB, why=f"{times} x alloc/free of {big} bytes")


def play_bytes(s: Script, sizes) -> None:
    for i, n in enumerate(sizes):
        s.call(fn("tensor_alloc"), n, save=f"b{i}", expect="ok")
        s.value(s.call(fn("tensor_bytes"), T(f"b{i}"), expect=None), n, why=f"alloc({n})")
        if n >= 3:
            s.call(fn("tensor_view"), T(f"b{i}"), 1, n - 2, save=f"bv{i}", expect="ok")
            s.value(s.call(fn("tensor_bytes"), T(f"bv{i}"), expect=None), n - 2, why=f"view(1, {n - 2})")
            s.call(fn("tensor_view"), T(f"b{i}"), n, 0, save=f"bz{i}", expect="ok")
            s.value(s.call(fn("tensor_bytes"), T(f"bz{i}"), expect=None), 0, why="an empty view")
            s.call(fn("tensor_free"), T(f"bz{i}"), expect="ok")
            s.call(fn("tensor_free"), T(f"bv{i}"), expect="ok")
        s.call(fn("tensor_free"), T(f"b{i}"), expect="ok")


def play_alloc(s: Script, n: int) -> None:
    """Two allocations never alias; an impossible size is refused with NULL."""
    a = alloc(s, "aa", n)
    b = alloc(s, "ab", n)
    s.descriptor("aa", bytes_=n, owner=1, why="an allocation owns its bytes")
    read_all(s, "aa", a, region=(0, 0), why="writing a second tensor leaves the first as it was")
    read_all(s, "ab", b)
    s.call(fn("tensor_alloc"), 2**62, save="huge", expect="error", why="4 EiB cannot be allocated: NULL, not a crash")
    s.call(fn("tensor_free"), T("aa"), expect="ok")
    s.call(fn("tensor_free"), T("ab"), expect="ok")


def play_ordering(s: Script, n: int, finish: str) -> None:
    """Work enqueued while the unit's stream is busy is complete once `finish` returns: the raw bytes,
    read on a stream ordered after nothing of the unit's, already hold the copy."""
    a = alloc(s, "oa", n)
    alloc(s, "ob", n)
    s.call(fn("synchronize"), expect="ok")
    s.hold()
    s.call(fn("tensor_copy"), T("ob"), 0, T("oa"), 0, n, expect="ok", why="queued behind the held stream")
    if finish == "cleanup":
        s.call(fn("cleanup"), expect="ok")
    else:
        s.call(fn("synchronize"), expect="ok")
    s.peek("ob", 0, n, a, check="stream", why=f"the copy enqueued before {fn(finish)} must be done when it returns")
    s.release()
    if finish == "cleanup":
        s.call(fn("init"), expect="ok", why="init after cleanup starts the backend again")
    read_all(s, "ob", a)
    s.call(fn("tensor_free"), T("oa"), expect="ok")
    s.call(fn("tensor_free"), T("ob"), expect="ok")


# ---------------------------------------------------------------------------
# Edges the plays above never reach (added for the mutation survivors of docs/mutation.md).
# Every backend of mini_gpu.h agrees on each: mini_cpu.c, mini_metal.m and the CUDA known-good.
# ---------------------------------------------------------------------------

def play_empty(s: Script, n: int, calls) -> None:
    """An empty allocation is a tensor of 0 bytes: every 0-byte transfer to, from and between it
    succeeds, any byte is out of its range.  (CUDA's known-good gives it no device storage at all, so a
    port whose data checks run before its 0-byte shortcut refuses the valid calls.)  `calls`: the
    functions besides alloc and free the unit's scenario already makes (its case 0), so that the
    scenario waits on no unit it did not wait on before."""
    s.call(fn("tensor_alloc"), 0, save="e0", expect="ok", why="0 bytes: an empty tensor, not a failure")
    if "bytes" in calls:
        s.value(s.call(fn("tensor_bytes"), T("e0"), expect=None), 0, why="alloc(0)")
    if "write" in calls:
        x = alloc(s, "ex", n)
        s.call(fn("tensor_write"), T("e0"), 0, HostIn(image(s, 1)), 0, expect="ok", why="0 bytes into an empty tensor")
        s.call(fn("tensor_write"), T("e0"), 0, HostIn(image(s, 1)), 1, expect="error", why="1 byte into 0 bytes")
    if "read" in calls:
        s.read(fn("tensor_read"), "e0", 0, 0, np.zeros(0, np.uint8), why="0 bytes out of an empty tensor")
        s.read(fn("tensor_read"), "e0", 0, 1, np.zeros(1, np.uint8), expect="error", why="1 byte out of 0 bytes")
    if "copy" in calls:
        s.call(fn("tensor_copy"), T("e0"), 0, T("ex"), 0, 0, expect="ok", why="0 bytes into an empty tensor")
        s.call(fn("tensor_copy"), T("ex"), 7, T("e0"), 0, 0, expect="ok", why="0 bytes out of an empty tensor")
        s.call(fn("tensor_copy"), T("e0"), 0, T("e0"), 0, 0, expect="ok", why="0 bytes from an empty tensor to itself")
        s.call(fn("tensor_copy"), T("e0"), 0, T("ex"), 0, 1, expect="error", why="1 byte into 0 bytes")
        s.call(fn("tensor_copy"), T("ex"), 0, T("e0"), 0, 1, expect="error", why="1 byte out of 0 bytes")
    if "view" in calls:
        s.call(fn("tensor_view"), T("e0"), 0, 0, save="ev", expect="ok", why="the empty view of an empty tensor")
        if "bytes" in calls:
            s.value(s.call(fn("tensor_bytes"), T("ev"), expect=None), 0, why="view(empty, 0, 0)")
        if "read" in calls:
            s.read(fn("tensor_read"), "ev", 0, 0, np.zeros(0, np.uint8), why="0 bytes out of an empty view")
        if "copy" in calls:
            s.call(fn("tensor_copy"), T("ev"), 0, T("ex"), n - 1, 0, expect="ok", why="0 bytes into an empty view")
        s.call(fn("tensor_view"), T("e0"), 0, 1, save="eb1", expect="error", why="1 byte of 0 bytes")
        s.call(fn("tensor_view"), T("e0"), 1, 0, save="eb2", expect="error", why="offset 1 of 0 bytes")
        s.call(fn("tensor_free"), T("ev"), expect="ok")
    if "write" in calls and "read" in calls:
        read_all(s, "ex", x, region=(0, 0), why="calls on an empty tensor leave the other tensor as it was")
    if "write" in calls:
        s.call(fn("tensor_free"), T("ex"), expect="ok")
    s.call(fn("tensor_free"), T("e0"), expect="ok")


def play_null_args(s: Script, n: int, calls) -> None:
    """NULL where mini_gpu.h wants a tensor or a host buffer is a bad argument: a non-zero return (NULL for
    a view), nothing written.  A NULL tensor holds no bytes; freeing one is harmless (play_free).
    `calls` as for play_empty."""
    if "bytes" in calls:
        s.value(s.call(fn("tensor_bytes"), NULL, expect=None), 0, why="a NULL tensor holds no bytes")
    if "view" in calls:
        s.call(fn("tensor_view"), NULL, 0, 0, save="nv", expect="error", why="a view of NULL")
    if "write" not in calls:
        return
    x = alloc(s, "nx", n)
    s.call(fn("tensor_write"), NULL, 0, HostIn(image(s, 5)), 5, expect="error", why="a write into NULL")
    s.call(fn("tensor_write"), T("nx"), 3, NULL, 5, expect="error", why="5 bytes from a NULL host buffer")
    if "read" in calls:
        s.call(fn("tensor_read"), NULL, 0, HostOut(5), 5, expect="error", why="a read from NULL")
        s.call(fn("tensor_read"), T("nx"), 3, NULL, 5, expect="error", why="5 bytes into a NULL host buffer")
    if "copy" in calls:
        s.call(fn("tensor_copy"), NULL, 0, T("nx"), 0, 5, expect="error", why="a copy into NULL")
        s.call(fn("tensor_copy"), T("nx"), 0, NULL, 0, 5, expect="error", why="a copy from NULL")
        s.call(fn("tensor_copy"), NULL, 0, NULL, 0, 0, expect="error", why="a copy between NULLs")
    if "read" in calls:
        read_all(s, "nx", x, region=(0, 0), why="calls with NULL arguments change nothing")
    s.call(fn("tensor_free"), T("nx"), expect="ok")


def play_view_ends(s: Script, n: int, calls) -> None:
    """Ranges checked against the view, not its base: each refused range here runs past the view's end or
    starts past it while staying inside the base's allocation, where no device (or driver) check would
    notice the access.  (The plays above refuse ranges that leave the allocation itself, which CUDA's
    driver refuses on its own: a port that checks nothing gets -1 back from cudaMemcpyAsync there.)
    Offsets are non-zero, so `bytes > size - offset` turned into `bytes > size + offset` shows; 0-byte
    ranges that end exactly at a view's end are valid.  Needs view, write and read; `calls` as for
    play_empty."""
    img = alloc(s, "vb", n).copy()
    vo, vn = 37, 61                                   # [37, 98) of n >= 4099 bytes
    s.call(fn("tensor_view"), T("vb"), vo, vn, save="v", expect="ok", why=f"[{vo}, {vo + vn}) of {n} bytes")
    s.read(fn("tensor_read"), "v", 5, vn - 5, img[vo + 5:vo + vn], why="up to the view's end, from offset 5")
    s.read(fn("tensor_read"), "v", 5, vn - 3, np.zeros(vn - 3, np.uint8), expect="error",
           why="2 bytes past the view's end, inside its base")
    s.read(fn("tensor_read"), "v", vn + 2, 1, np.zeros(1, np.uint8), expect="error",
           why="an offset past the view's end, inside its base")
    s.read(fn("tensor_read"), "v", vn, 0, np.zeros(0, np.uint8), why="0 bytes at the view's very end")
    s.call(fn("tensor_write"), T("v"), 5, HostIn(image(s, vn - 3)), vn - 3, expect="error",
           why="2 bytes past the view's end, inside its base")
    s.call(fn("tensor_write"), T("v"), vn + 2, HostIn(image(s, 1)), 1, expect="error",
           why="an offset past the view's end, inside its base")
    s.call(fn("tensor_write"), T("v"), vn, HostIn(image(s, 1)), 0, expect="ok", why="0 bytes at the view's very end")
    if "copy" in calls:
        src = alloc(s, "vs", n)
        s.call(fn("tensor_view"), T("vs"), 7, vn, save="sv", expect="ok")
        s.call(fn("tensor_copy"), T("v"), 5, T("vs"), 0, vn - 3, expect="error",
               why="the destination runs 2 bytes past its view's end, inside its base")
        s.call(fn("tensor_copy"), T("v"), vn + 2, T("vs"), 0, 1, expect="error",
               why="the destination offset lies past its view's end, inside its base")
        s.call(fn("tensor_copy"), T("vb"), 101, T("sv"), 5, vn - 3, expect="error",
               why="the source runs 2 bytes past its view's end, inside its base")
        s.call(fn("tensor_copy"), T("vb"), 101, T("sv"), vn + 2, 1, expect="error",
               why="the source offset lies past its view's end, inside its base")
        s.call(fn("tensor_copy"), T("v"), vn, T("vs"), 0, 0, expect="ok", why="0 bytes at the destination's very end")
        s.call(fn("tensor_copy"), T("vb"), n, T("sv"), vn, 0, expect="ok", why="0 bytes at both very ends")
    read_all(s, "vb", img, region=(0, 0), why="calls refused at a view's end change nothing")
    if "copy" in calls:
        s.call(fn("tensor_copy"), T("v"), 3, T("sv"), 3, vn - 3, expect="ok", why="up to both views' ends")
        img[vo + 3:vo + vn] = src[7 + 3:7 + vn]
        read_all(s, "vb", img, region=(vo + 3, vo + vn), why="a copy ending at both views' ends")
        s.call(fn("tensor_free"), T("sv"), expect="ok")
        s.call(fn("tensor_free"), T("vs"), expect="ok")
    s.call(fn("tensor_free"), T("v"), expect="ok")
    s.call(fn("tensor_free"), T("vb"), expect="ok")


def play_edges(s: Script, n: int, calls) -> None:
    """The edge plays of the transfer and view units, in one case: ranges at and past a view's end, empty
    tensors and transfers, NULL arguments (only the API calls in `calls` besides alloc and free)."""
    play_view_ends(s, n, calls)
    play_empty(s, n, calls)
    play_null_args(s, n, calls)
