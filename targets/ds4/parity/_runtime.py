"""Plays for ds4's runtime scenarios (ds4_gpu.h: tensors, command batches, the model map).

ds4_gpu.h states signatures, not contracts; the contract here is what both of
ds4's backends do and what ds4.c relies on:
  - success is non-zero (1), failure 0; a refused allocation or view is NULL;
  - a view aliases [offset, offset+bytes) of its base, freeing it never frees
    the base; tensor_bytes is the size given to alloc/view;
  - tensor copies are commands: ds4_metal.m refuses one outside
    begin_commands/end_commands, so every copy here sits in a batch; writes,
    reads and fills are made outside batches, and reads follow synchronize or
    end_commands (Metal's read is a plain memcpy of shared memory);
  - end_commands and synchronize return once all enqueued work is done;
    flush_commands submits the batch so far and keeps later work ordered after it;
  - tensor_contents(view) = tensor_contents(base) + offset; a managed tensor's
    contents are readable by the host after synchronize;
  - the model map is the engine's mmap of the GGUF file: registration calls
    (set_model_map, _range, _fd, cache_model_range) refuse a NULL map or a range
    outside it, and ops read the right bytes through the map afterwards;
    cache_q8_f16_range may expand a Q8_0 matrix to F16 for later matmuls
    (upstream CUDA does for allow-listed labels), so a matmul after it must
    still match a numpy decode of those Q8_0 blocks;
  - should_use_managed_kv_cache(0 or small sizes) is 0 (Metal always says 0;
    upstream CUDA says 1 only for caches of 8 GiB or more).
Sizes and offsets are odd on purpose; fill views sit at 4-byte multiples
(a float fill of a misaligned address is a fault on a GPU, not a contract).
"""
import numpy as np

from porter.spec.scenario import NULL, HostIn, HostOut, ModelFd, ModelMap, Script, Str, T

P = "ds4_gpu_"
MiB = 1 << 20
Q8_LABEL = "tensor:blk.0.ffn_gate_shexp.weight"  # an F16-cache allow-listed label in upstream ds4_cuda.cu


def fn(name: str) -> str:
    return P + name


def image(s: Script, n: int) -> np.ndarray:
    return s.rng.integers(0, 256, n, dtype=np.uint8)


def alloc(s: Script, name: str, n: int, managed: bool = False) -> np.ndarray:
    s.call(fn("tensor_alloc_managed" if managed else "tensor_alloc"), n, save=name, expect="ok", why=f"{n} bytes")
    img = image(s, n)
    s.call(fn("tensor_write"), T(name), 0, HostIn(img), n, expect="ok")
    return img


def rewrite(s: Script, name: str, n: int) -> np.ndarray:
    img = image(s, n)
    s.call(fn("tensor_write"), T(name), 0, HostIn(img), n, expect="ok")
    return img.copy()


def read_all(s: Script, name: str, want: np.ndarray, region=None, why: str = "", check: str = "exact") -> None:
    s.read(fn("tensor_read"), name, 0, want.size, want, region=region, why=why, check=check)


def free(s: Script, *names: str) -> None:
    for n in names:
        s.call(fn("tensor_free"), T(n), expect="ok")


def play_init(s: Script) -> None:
    s.call(fn("init"), expect="ok", why="a device is present")
    s.call(fn("init"), expect="ok", why="init twice is harmless")


def play_roundtrip(s: Script, n: int, managed: bool = False) -> None:
    img = alloc(s, "rt", n, managed)
    read_all(s, "rt", img, why="a whole write reads back")
    if n >= 3:
        off = min(1 + (n // 3) | 1, n - 1)
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
    free(s, "rt")


def play_write_errors(s: Script, n: int) -> None:
    img = alloc(s, "wb", n)
    s.call(fn("tensor_write"), T("wb"), n - 2, HostIn(image(s, 5)), 5, expect="error",
           why="the range runs 3 bytes past the end")
    s.call(fn("tensor_write"), T("wb"), n + 1, HostIn(image(s, 1)), 0, expect="error", why="offset past the end")
    s.call(fn("tensor_write"), T("wb"), 2**64 - 2, HostIn(image(s, 4)), 4, expect="error",
           why="offset + bytes overflows 64 bits")
    vn = min(101, n - 40)
    s.call(fn("tensor_view"), T("wb"), 37, vn, save="wv", expect="ok")
    s.call(fn("tensor_write"), T("wv"), vn - 10, HostIn(image(s, 20)), 20, expect="error",
           why="the range runs past the end of the view (though still inside its base)")
    read_all(s, "wb", img, region=(0, 0), why="refused writes change nothing")
    free(s, "wv", "wb")


def play_read_offsets(s: Script, n: int) -> None:
    img = alloc(s, "rd", n)
    for off, ln in ((1, 3), (7, 129), (n // 2 | 1, 1), (n - 3, 3), (255, 513)):
        if off + ln <= n:
            s.read(fn("tensor_read"), "rd", off, ln, img[off:off + ln], why=f"{ln} bytes at offset {off}")
    s.read(fn("tensor_read"), "rd", n - 2, 5, np.zeros(5, np.uint8), expect="error", why="runs past the end")
    s.read(fn("tensor_read"), "rd", n + 3, 1, np.zeros(1, np.uint8), expect="error", why="offset past the end")
    free(s, "rd")


def play_view(s: Script, n: int) -> None:
    img = alloc(s, "vb", n).copy()
    vo, vn = 37, n - 37 - 29
    s.call(fn("tensor_view"), T("vb"), vo, vn, save="v", expect="ok", why=f"[{vo}, {vo + vn}) of {n} bytes")
    s.value(s.call(fn("tensor_bytes"), T("v"), expect=None), vn, why="a view's size is the size it was given")
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
    free(s, "w", "v", "empty")
    read_all(s, "vb", img, region=(0, 0), why="freeing views leaves the base as it was")
    free(s, "vb")


def play_copy(s: Script, n1: int, n2: int) -> None:
    """Copies (inside a command batch) between odd ranges of tensors and views."""
    a = alloc(s, "ca", n1)
    b = alloc(s, "cb", n2).copy()
    do, so, ln = 101, 13, min(517, n1 - 13, n2 - 101)
    s.call(fn("begin_commands"), expect="ok")
    s.call(fn("tensor_copy"), T("cb"), do, T("ca"), so, ln, expect="ok", why=f"{ln} bytes, odd offsets")
    s.call(fn("end_commands"), expect="ok")
    b[do:do + ln] = a[so:so + ln]
    read_all(s, "cb", b, region=(do, do + ln), why="the copied range, and nothing else")
    s.call(fn("tensor_view"), T("ca"), 3, n1 - 6, save="va", expect="ok")
    s.call(fn("tensor_view"), T("cb"), n2 // 2, n2 - n2 // 2 - 1, save="vb", expect="ok")
    b = rewrite(s, "cb", n2)
    ln2 = min(255, n1 - 8, n2 - n2 // 2 - 8)
    s.call(fn("begin_commands"), expect="ok")
    s.call(fn("tensor_copy"), T("vb"), 7, T("va"), 1, ln2, expect="ok", why="view to view")
    s.call(fn("end_commands"), expect="ok")
    b[n2 // 2 + 7:n2 // 2 + 7 + ln2] = a[4:4 + ln2]
    read_all(s, "cb", b, region=(n2 // 2 + 7, n2 // 2 + 7 + ln2), why="copy between views at their offsets")
    b = rewrite(s, "cb", n2)
    s.call(fn("begin_commands"), expect="ok")
    s.call(fn("tensor_copy"), T("cb"), n2 - 1, T("ca"), n1 - 1, 1, expect="ok", why="the last byte")
    s.call(fn("tensor_copy"), T("cb"), 0, T("ca"), 0, 0, expect="ok", why="0 bytes")
    s.call(fn("tensor_copy"), T("cb"), 0, T("ca"), n1 - 5, 9, expect="error", why="source range past its end")
    s.call(fn("tensor_copy"), T("cb"), n2 - 5, T("ca"), 0, 9, expect="error", why="destination range past its end")
    s.call(fn("tensor_copy"), T("vb"), 0, T("ca"), 0, n2 - n2 // 2, expect="error",
           why="destination range past the end of the view (inside its base)")
    s.call(fn("end_commands"), expect="ok")
    b[n2 - 1] = a[n1 - 1]
    read_all(s, "cb", b, region=(n2 - 1, n2), why="a one-byte copy at the end; refused copies change nothing")
    free(s, "va", "vb", "ca", "cb")


def play_free(s: Script, n: int) -> None:
    img = alloc(s, "fb", n).copy()
    s.call(fn("tensor_view"), T("fb"), 21, n - 40, save="fv", expect="ok")
    free(s, "fv")
    s.call(fn("tensor_view"), T("fb"), 0, n - 1, save="f0", expect="ok")
    free(s, "f0")
    new = image(s, 33)
    s.call(fn("tensor_write"), T("fb"), 7, HostIn(new), 33, expect="ok", why="the base after its views were freed")
    img[7:40] = new
    read_all(s, "fb", img, region=(7, 40), why="the base after its views were freed")
    free(s, "fb")
    s.call(fn("tensor_free"), NULL, expect="ok")
    big, times = 32 * MiB + 3, 12
    s.call(fn("tensor_alloc"), big, save="warm", expect="ok")
    free(s, "warm")
    m0 = s.mem()
    for i in range(times):
        s.call(fn("tensor_alloc"), big, save=f"l{i}", expect="ok")
        s.call(fn("tensor_write"), T(f"l{i}"), big - 8, HostIn(image(s, 8)), 8, expect="ok")
        free(s, f"l{i}")
    s.no_leak(m0, s.mem(), slack=32 * MiB, why=f"{times} x alloc/free of {big} bytes")


def play_bytes(s: Script, sizes) -> None:
    for i, n in enumerate(sizes):
        s.call(fn("tensor_alloc"), n, save=f"b{i}", expect="ok")
        s.value(s.call(fn("tensor_bytes"), T(f"b{i}"), expect=None), n, why=f"alloc({n})")
        if n >= 3:
            s.call(fn("tensor_view"), T(f"b{i}"), 1, n - 2, save=f"bv{i}", expect="ok")
            s.value(s.call(fn("tensor_bytes"), T(f"bv{i}"), expect=None), n - 2, why=f"view(1, {n - 2})")
            s.call(fn("tensor_view"), T(f"b{i}"), n, 0, save=f"bz{i}", expect="ok")
            s.value(s.call(fn("tensor_bytes"), T(f"bz{i}"), expect=None), 0, why="an empty view")
            free(s, f"bz{i}", f"bv{i}")
        free(s, f"b{i}")


def play_alloc(s: Script, n: int, managed: bool = False, refuse_huge: bool = True) -> None:
    a = alloc(s, "aa", n, managed)
    b = alloc(s, "ab", n, managed)
    s.descriptor("aa", bytes_=n, owner=1, why="an allocation owns its bytes")
    read_all(s, "aa", a, region=(0, 0), why="writing a second tensor leaves the first as it was")
    read_all(s, "ab", b)
    if refuse_huge:
        play_refuse_huge(s, managed)
    free(s, "aa", "ab")


def play_refuse_huge(s: Script, managed: bool) -> None:
    # Upstream's failed cudaMallocManaged leaves its error for the next launch's cudaGetLastError (measured
    # on an H100: the fill after it returned 0); the engine never goes on after a failed allocation, so a
    # scenario that goes on must make this refusal its last call before cleanup.
    name = "tensor_alloc_managed" if managed else "tensor_alloc"
    s.call(fn(name), 2**62, save="huge", expect="error", why="4 EiB cannot be allocated: NULL, not a crash")


def play_managed_host(s: Script, n: int) -> None:
    """A managed tensor's contents are host memory: after synchronize the host sees what was written and filled."""
    img = alloc(s, "mt", n, managed=True).copy()
    s.call(fn("synchronize"), expect="ok")
    p = s.call(fn("tensor_contents"), T("mt"), expect="ok")
    s.host_bytes(p, 0, n, img, why="the host reads a managed tensor through its contents")
    cnt = (n // 4) // 2 | 1
    v = np.float32(s.rng.standard_normal())
    s.call(fn("tensor_fill_f32"), T("mt"), float(v), cnt, expect="ok")
    s.call(fn("synchronize"), expect="ok")
    img[:4 * cnt] = np.full(cnt, v, np.float32).view(np.uint8)
    s.host_bytes(p, 0, n, img, why="a fill is visible through the contents after synchronize")
    free(s, "mt")


def play_contents(s: Script, n: int) -> None:
    """contents(view) is contents(base) + offset, nested views add up, the pointer is stable."""
    alloc(s, "cb", n)
    c0 = s.call(fn("tensor_contents"), T("cb"), expect="ok")
    s.call(fn("tensor_view"), T("cb"), 37, n - 60, save="cv", expect="ok")
    c1 = s.call(fn("tensor_contents"), T("cv"), expect="ok")
    s.ptr_delta(c0, c1, 37, why="a view's contents start at its offset")
    s.call(fn("tensor_view"), T("cv"), 11, 50, save="cw", expect="ok")
    s.ptr_delta(c0, s.call(fn("tensor_contents"), T("cw"), expect="ok"), 48, why="nested view offsets add up")
    s.ptr_delta(c0, s.call(fn("tensor_contents"), T("cb"), expect="ok"), 0, why="the same tensor, the same pointer")
    s.call(fn("tensor_contents"), NULL, expect="error", why="no tensor, no contents")
    free(s, "cw", "cv", "cb")


def play_fill(s: Script, n: int) -> None:
    """fill_f32 writes `count` floats from the start and nothing else; a count past the end is refused."""
    img = alloc(s, "fl", n).copy()
    cnt = (n // 4 - 3) | 1
    v = np.float32(s.rng.standard_normal())
    s.call(fn("tensor_fill_f32"), T("fl"), float(v), cnt, expect="ok", why=f"{cnt} floats")
    s.call(fn("synchronize"), expect="ok")
    img[:4 * cnt] = np.full(cnt, v, np.float32).view(np.uint8)
    read_all(s, "fl", img, region=(0, 4 * cnt), why=f"{cnt} copies of {float(v)!r}, then the old bytes")
    s.call(fn("tensor_view"), T("fl"), 4 * 37, 4 * 101 + 3, save="fv", expect="ok")
    img = rewrite(s, "fl", n)  # each read judges one fill: a fault of the first does not show again
    w = np.float32(s.rng.standard_normal())
    s.call(fn("tensor_fill_f32"), T("fv"), float(w), 99, expect="ok", why="99 floats through a view at 148")
    s.call(fn("synchronize"), expect="ok")
    img[148:148 + 4 * 99] = np.full(99, w, np.float32).view(np.uint8)
    read_all(s, "fl", img, region=(148, 148 + 4 * 99), why="a fill through a view lands at its offset")
    img = rewrite(s, "fl", n)
    s.call(fn("tensor_fill_f32"), T("fv"), 1.0, 102, expect="error", why="102 floats do not fit in 407 bytes")
    s.call(fn("tensor_fill_f32"), T("fl"), 1.0, n // 4 + 1, expect="error", why="one float past the end")
    s.call(fn("tensor_fill_f32"), T("fl"), 1.0, 0, expect="ok", why="0 floats")
    s.call(fn("synchronize"), expect="ok")
    read_all(s, "fl", img, region=(0, 0), why="refused fills change nothing")
    free(s, "fv", "fl")


def play_ordering(s: Script, n: int, finish: str) -> None:
    """Work enqueued while the device is busy (a fill, then a copy of it, in a batch) is complete
    once `finish` returns: the raw bytes, read on a stream ordered after nothing, hold the result."""
    if n % 4:
        raise ValueError("the ordering play fills whole floats: n must be a multiple of 4")
    alloc(s, "oa", n)
    alloc(s, "ob", n)
    v = np.float32(s.rng.standard_normal())
    want = np.full(n // 4, v, np.float32).view(np.uint8)
    s.call(fn("synchronize"), expect="ok")
    s.hold()
    s.call(fn("tensor_fill_f32"), T("oa"), float(v), n // 4, expect="ok", why="queued behind the busy device")
    s.call(fn("begin_commands"), expect="ok")
    s.call(fn("tensor_copy"), T("ob"), 0, T("oa"), 0, 4 * (n // 4), expect="ok", why="queued behind the fill")
    if finish == "end_commands":
        s.call(fn("end_commands"), expect="ok")
    elif finish == "synchronize":
        s.call(fn("synchronize"), expect="ok", why="also ends the open batch (ds4_metal.m)")
    elif finish == "cleanup":
        s.call(fn("cleanup"), expect="ok")
    else:
        raise ValueError(finish)
    s.peek("ob", 0, want.size, want, check="stream", why=f"work enqueued before {fn(finish)} is done when it returns")
    s.release()
    if finish == "cleanup":
        s.call(fn("init"), expect="ok", why="init after cleanup starts the backend again")
    read_all(s, "ob", want, why="read back")
    free(s, "oa", "ob")


def play_flush(s: Script, n: int) -> None:
    """A batch split by flush_commands keeps its order: a copy after the flush reads what a copy
    before it wrote, and the batch goes on after the flush."""
    a = alloc(s, "fa", n)
    alloc(s, "fb", n)
    alloc(s, "fc", n)
    s.call(fn("begin_commands"), expect="ok")
    s.call(fn("tensor_copy"), T("fb"), 0, T("fa"), 0, n, expect="ok")
    s.call(fn("flush_commands"), expect="ok", why="submits the batch so far")
    s.call(fn("tensor_copy"), T("fc"), 0, T("fb"), 0, n, expect="ok", why="after the flush, reads the first copy")
    s.call(fn("end_commands"), expect="ok")
    read_all(s, "fc", a, why="a -> b before the flush, b -> c after it")
    s.call(fn("begin_commands"), expect="ok", why="a new batch after end")
    s.call(fn("flush_commands"), expect="ok", why="flushing an empty batch")
    s.call(fn("end_commands"), expect="ok")
    free(s, "fa", "fb", "fc")


# ---------------------------------------------------------------------------
# The model map: a real GGUF file, mmapped by the child
# ---------------------------------------------------------------------------

class Model:
    """A small GGUF written for the scenario: an F16 token-embedding table and a Q8_0 matrix."""

    def __init__(self, ctx, rng, n_vocab=37, n_embd=67, in_dim=256, out_dim=96):
        import gguf

        from reference import quant

        self.n_vocab, self.n_embd, self.in_dim, self.out_dim = n_vocab, n_embd, in_dim, out_dim
        self.emb = rng.standard_normal((n_vocab, n_embd)).astype(np.float16)
        self.q8 = quant.random_blocks("Q8_0", out_dim, in_dim, rng)
        path = ctx.new_file(f"model-{rng.integers(1 << 62):x}.gguf")
        w = gguf.GGUFWriter(str(path), "porter-scenario")
        # page-aligned tensors: a backend that registers each tensor's pages on their own (upstream
        # ds4_cuda.cu without set_model_map) must not find two tensors on one page
        w.add_custom_alignment(4096)
        w.add_tensor("token_embd.weight", self.emb)
        w.add_tensor("blk.0.ffn_gate_shexp.weight", self.q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        r = gguf.GGUFReader(str(path))
        info = {t.name: (int(t.data_offset), int(t.n_bytes)) for t in r.tensors}
        self.emb_off, self.emb_bytes = info["token_embd.weight"]
        self.q8_off, self.q8_bytes = info["blk.0.ffn_gate_shexp.weight"]
        self.path = str(path)
        self.size = path.stat().st_size
        # the F16 expansion of the Q8_0 blocks, decoded in numpy: f16(d * q), as ds4's dequant kernel rounds it
        self.w_f16 = quant.dequantize(self.q8, "Q8_0", (out_dim, in_dim)).astype(np.float16)

    @property
    def map(self):
        return ModelMap(self.path)

    @property
    def fd(self):
        return ModelFd(self.path)


def read_embedding(s: Script, m: Model, n_hc: int = 3, why: str = "") -> None:
    """ds4_gpu_embed_token_hc_tensor reads token rows through the map: n_hc copies of row `token`, widened."""
    s.call(fn("tensor_alloc"), 4 * m.n_embd * n_hc, save="emb_out", expect="ok")
    for token in (0, m.n_vocab - 1, int(s.rng.integers(1, m.n_vocab - 1))):
        s.call(fn("embed_token_hc_tensor"), T("emb_out"), m.map, m.size, m.emb_off, m.n_vocab, token, m.n_embd, n_hc,
               expect="ok", why=f"token {token} through the model map")
        s.call(fn("synchronize"), expect="ok")
        want = np.tile(m.emb[token].astype(np.float32), n_hc).view(np.uint8)
        read_all(s, "emb_out", want, why=why or f"F16 row {token} of the mmapped GGUF, widened")
    free(s, "emb_out")


def matmul_through_map(s: Script, m: Model, n_tok: int = 3, why: str = "") -> None:
    """ds4_gpu_matmul_q8_0_tensor on the mmapped Q8_0 matrix, against numpy: f16(x) . f16(d*q).
    The tolerance is the ds4 matmul spec's (activation quantization, NMSE ~3e-5): any right
    path passes, a wrong expansion (scale, block stride, row order) is off by orders of magnitude."""
    x = s.rng.standard_normal((n_tok, m.in_dim)).astype(np.float32)
    s.call(fn("tensor_alloc"), x.nbytes, save="mm_x", expect="ok")
    s.call(fn("tensor_write"), T("mm_x"), 0, HostIn(x), x.nbytes, expect="ok")
    s.call(fn("tensor_alloc"), 4 * n_tok * m.out_dim, save="mm_out", expect="ok")
    s.call(fn("matmul_q8_0_tensor"), T("mm_out"), m.map, m.size, m.q8_off, m.in_dim, m.out_dim, T("mm_x"), n_tok,
           expect="ok", why=f"{n_tok} tokens through the model map")
    s.call(fn("synchronize"), expect="ok")
    want = x.astype(np.float16).astype(np.float64) @ m.w_f16.astype(np.float64).T
    r = s.call(fn("tensor_read"), T("mm_out"), 0, HostOut(4 * n_tok * m.out_dim), 4 * n_tok * m.out_dim, expect="ok")
    s.floats(r, want, nmse=1e-4, max_err_rms=6e-2, why=why or "x . W, W the numpy decode of the Q8_0 blocks")
    free(s, "mm_x", "mm_out")


def play_set_model_map(s: Script, m: Model) -> None:
    s.call(fn("set_model_map"), m.map, m.size, expect="ok", why="the mmapped GGUF")
    read_embedding(s, m)
    s.call(fn("set_model_map"), m.map, m.size, expect="ok", why="registering the same map again")
    matmul_through_map(s, m, n_tok=1)
    s.call(fn("set_model_map"), NULL, m.size, expect="error", why="no map")
    s.call(fn("set_model_map"), m.map, 0, expect="error", why="an empty map")


def play_set_model_fd(s: Script, m: Model) -> None:
    s.call(fn("set_model_map"), m.map, m.size, expect="ok")
    s.call(fn("set_model_fd"), m.fd, expect="ok", why="the file the map was made from")
    read_embedding(s, m, why="reads through the map after set_model_fd")
    matmul_through_map(s, m, n_tok=3)
    s.call(fn("set_model_fd"), -1, expect="ok", why="-1: no file (ds4 without a model fd)")
    read_embedding(s, m, why="reads through the map after set_model_fd(-1)")


def play_set_model_map_range(s: Script, m: Model) -> None:
    lo = min(m.emb_off, m.q8_off)
    s.call(fn("set_model_map_range"), m.map, m.size, lo, m.size - lo, expect="ok",
           why="the tensor-data range of the mmapped GGUF, as ds4.c registers it")
    read_embedding(s, m)
    matmul_through_map(s, m, n_tok=3)
    s.call(fn("set_model_map_range"), NULL, m.size, 0, m.size, expect="error", why="no map")


def play_cache_model_range(s: Script, m: Model) -> None:
    s.call(fn("cache_model_range"), m.map, m.size, m.emb_off, m.emb_bytes, Str("tensor:token_embd.weight"),
           expect="ok", why="the embedding table, as ds4.c caches tensor spans")
    read_embedding(s, m, why="reads of a cached range")
    s.call(fn("cache_model_range"), m.map, m.size, m.q8_off, m.q8_bytes, Str("tensor-span:1"), expect="ok")
    matmul_through_map(s, m, n_tok=1)
    s.call(fn("cache_model_range"), m.map, m.size, m.size - 8, 16, Str("past the end"), expect="error",
           why="the range runs 8 bytes past the map")
    s.call(fn("cache_model_range"), m.map, m.size, m.size + 1, 1, Str("offset past the end"), expect="error",
           why="the offset lies past the map")
    s.call(fn("cache_model_range"), m.map, m.size, m.emb_off, 0, Str("empty"), expect="ok", why="0 bytes")


def play_cache_q8_f16(s: Script, m: Model) -> None:
    s.call(fn("cache_q8_f16_range"), m.map, m.size, m.q8_off, m.q8_bytes, m.in_dim, m.out_dim, Str(Q8_LABEL),
           expect="ok", why="a Q8_0 matrix of the mmapped GGUF")
    matmul_through_map(s, m, n_tok=3, why="a matmul after the F16 expansion, vs the numpy decode of the Q8_0 blocks")
    matmul_through_map(s, m, n_tok=5, why="a second matmul reuses the expansion")
    s.call(fn("cache_q8_f16_range"), m.map, m.size, m.size - 10, 34, 32, 1, Str(Q8_LABEL), expect="error",
           why="the range runs past the map")
    s.call(fn("cache_q8_f16_range"), m.map, m.size, m.q8_off, 0, m.in_dim, m.out_dim, Str(Q8_LABEL), expect="ok",
           why="0 bytes: nothing to cache")


def play_quality(s: Script, m: Model) -> None:
    s.call(fn("set_quality"), True, expect="ok")
    s.call(fn("cache_q8_f16_range"), m.map, m.size, m.q8_off, m.q8_bytes, m.in_dim, m.out_dim, Str(Q8_LABEL),
           expect="ok", why="quality mode may skip the F16 cache, never fail the preload (ds4.c aborts on 0)")
    matmul_through_map(s, m, n_tok=3, why="quality mode computes the same product")
    play_roundtrip(s, 1031)
    s.call(fn("set_quality"), False, expect="ok")
    matmul_through_map(s, m, n_tok=3, why="and so does the default mode")


def play_memory_report(s: Script, m: Model) -> None:
    """The report prints (its label, fresh per seed, shows on stdout or stderr) before and after a model map."""
    tag = f"porter-{s.rng.integers(1 << 40):x}"
    r = s.call(fn("print_memory_report"), Str(f"{tag} before any model"), expect="ok", why="right after init")
    s.printed(r, f"{tag} before any model", why="a report names its label")
    s.call(fn("set_model_map"), m.map, m.size, expect="ok")
    alloc(s, "mr", 4099)
    r = s.call(fn("print_memory_report"), Str(f"{tag} after graph alloc"), expect="ok")
    s.printed(r, f"{tag} after graph alloc")
    read_embedding(s, m, why="the backend still works after a report")
    free(s, "mr")


def play_managed_kv(s: Script) -> None:
    for kv, ctx_bytes in ((0, 0), (0, 64 * MiB), (4096, 4096), (64 * MiB + 3, 256 * MiB)):
        s.value(s.call(fn("should_use_managed_kv_cache"), kv, ctx_bytes, expect=None), 0,
                why=f"kv {kv} bytes, context {ctx_bytes} bytes: small caches stay in device memory")
