"""minimoe's runtime scenario cases added for mutation-testing survivors, each shown refusing the flaw it exists for.

Host mode: targets/minimoe/mini_cpu.c (a complete CPU backend of mini_gpu.h) stands in for the known-good,
and a one-line edit of it for the flaw.  The CUDA mutants these cases answer (targets/minimoe/mutation.json)
need a GPU; the flaw classes do not.  The cases (targets/minimoe/parity/_runtime.py):

- play_empty: an empty allocation (alloc(0); CUDA's known-good gives it no storage, data NULL) is a tensor of
  0 bytes; 0-byte reads, writes and copies on it succeed.  The survivors: read's and copy's 0-byte shortcut
  dropped or turned to `bytes == -1` (their data checks then refuse the storage-less tensor), alloc's
  `bytes > 0` turned to `>=`.
- play_null_args: NULL tensors and NULL host buffers are bad arguments (mini_gpu.h: non-zero); a NULL tensor
  holds 0 bytes (every backend: CPU, Metal, the CUDA known-good).  The survivors: copy's NULL check dropped
  or turned to `&&`, read's NULL-buffer check returning 0, tensor_bytes(NULL) returning 1 or -1.
- play_view_ends: ranges past a view's end (or offsets past it) that stay inside the base's allocation are
  refused; 0-byte ranges ending at a view's end are valid.  The survivors: read's and copy's range checks
  dropped, turned to `&&`, or `size - offset` turned to `size + offset`, and copy's `dst_offset > size`
  turned to `>=`.  The older cases refuse ranges that leave the allocation, which the CUDA driver refuses
  by itself (cudaMemcpyAsync returns cudaErrorInvalidValue), so on the GPU those mutants returned -1 and
  survived.  Host memory has no such check: here the older cases catch those flaws too (by the bytes they
  write or read out of bounds), so for them ("driver-masked") the test shows the new case alone refusing
  the flaw instead of the older cases letting it through.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import mini_cpu_flaws
from porter.gates.parity.scenario import prepare, scenario_uses
from porter.spec import load_spec, load_specs
from porter.spec.scenario import is_scenario
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
CC = mini_cpu_flaws.CC
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build mini_cpu.c")
P = "mini_gpu_"
TOUCHED = [P + u for u in ("tensor_alloc", "tensor_bytes", "tensor_copy", "tensor_read", "tensor_write",
                           "tensor_view")]

READ_HEAD = ("int mini_gpu_tensor_read(const mini_gpu_tensor *tensor, uint64_t offset, void *data, uint64_t bytes) "
             "{\n    if (!tensor || !range_ok(offset, bytes, tensor->bytes)) return 1;")
COPY_RANGES = ("    if (!range_ok(dst_offset, bytes, dst->bytes) || !range_ok(src_offset, bytes, src->bytes)) "
               "return 1;")
EDGES = "edges: "  # each touched unit's one new case of the edge plays

# name: (unit, the edit of mini_cpu.c (old, new), the check that must refuse it, the new case that does,
#        driver-masked: the older cases catch it here too (host memory has no allocation bounds))
FLAWS = {
    "alloc_refuses_zero_bytes": (P + "tensor_alloc", (
        "    if (bytes > (uint64_t)SIZE_MAX) return NULL;",
        "    if (bytes > (uint64_t)SIZE_MAX || bytes == 0) return NULL;"), "rc", EDGES, False),
    "bytes_of_null_is_one": (P + "tensor_bytes", (
        "    return tensor ? tensor->bytes : 0;", "    return tensor ? tensor->bytes : 1;"), "exact", EDGES, False),
    # the CUDA mutants `bytes == 0` -> `bytes == -1` and the shortcut dropped: the data checks then refuse a
    # tensor without storage, as an empty allocation is there
    "read_zero_bytes_needs_storage": (P + "tensor_read", (
        "    if (bytes == 0) return 0;\n    if (!data) return 1;\n    memmove(data,",
        "    if (bytes == 0) return tensor->bytes ? 0 : 1;\n    if (!data) return 1;\n    memmove(data,"),
        "rc", EDGES, False),
    "copy_zero_bytes_needs_storage": (P + "tensor_copy", (
        "    if (bytes == 0) return 0;\n    memmove((uint8_t *)dst->data",
        "    if (bytes == 0) return dst->bytes && src->bytes ? 0 : 1;\n    memmove((uint8_t *)dst->data"),
        "rc", EDGES, False),
    "read_null_buffer_succeeds": (P + "tensor_read", (
        "    if (!data) return 1;\n    memmove(data,", "    if (!data) return 0;\n    memmove(data,"),
        "error-return", EDGES, False),
    "write_null_buffer_read": (P + "tensor_write", (
        "    if (!data) return 1;\n    memmove((uint8_t *)tensor->data + offset, data",
        "    memmove((uint8_t *)tensor->data + offset, data"), "crash", EDGES, False),
    "copy_null_check_and": (P + "tensor_copy", (
        "    if (!dst || !src) return 1;", "    if (!dst && !src) return 1;"), "crash", EDGES, False),
    "view_of_null_dereferenced": (P + "tensor_view", (
        "    if (!base || !range_ok(offset, bytes, base->bytes)) return NULL;",
        "    if (!range_ok(offset, bytes, base->bytes)) return NULL;"), "crash", EDGES, False),
    "copy_dst_offset_at_end_refused": (P + "tensor_copy", (
        COPY_RANGES,
        "    if (dst_offset >= dst->bytes || bytes > dst->bytes - dst_offset || "
        "!range_ok(src_offset, bytes, src->bytes)) return 1;"), "rc", EDGES, False),
    "copy_dst_range_plus": (P + "tensor_copy", (
        COPY_RANGES,
        "    if (dst_offset > dst->bytes || bytes > dst->bytes + dst_offset || "
        "!range_ok(src_offset, bytes, src->bytes)) return 1;"), "guard", EDGES, True),
    "copy_src_range_unchecked": (P + "tensor_copy", (
        COPY_RANGES, "    if (!range_ok(dst_offset, bytes, dst->bytes)) return 1;"), "guard", EDGES, True),
    "read_range_plus": (P + "tensor_read", (
        READ_HEAD, READ_HEAD.replace("!range_ok(offset, bytes, tensor->bytes)",
                                     "offset > tensor->bytes || bytes > tensor->bytes + offset")),
        "error-return", EDGES, True),
    "read_range_and": (P + "tensor_read", (
        READ_HEAD, READ_HEAD.replace("!range_ok(offset, bytes, tensor->bytes)",
                                     "(offset > tensor->bytes && bytes > tensor->bytes - offset)")),
        "error-return", EDGES, True),
}


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def libs(target, tmp_path_factory):
    # "plain": mini_cpu.c itself, the stand-in every touched scenario must pass
    return mini_cpu_flaws.build(target.checkout, tmp_path_factory.mktemp("mini_cpu_runtime_flaws"),
                                {"plain": (None, None), **FLAWS}, cflags=())


def _run(target, spec, lib, ws):
    return mini_cpu_flaws.run_host(target, spec, lib, ws, timeout=120)


def _split(spec, label: str):
    """The spec with its new case alone, and with its older cases alone."""
    new = [c for c in spec.cases if c.label.startswith(label)]
    assert len(new) == 1, [c.label for c in spec.cases]
    return (dataclasses.replace(spec, cases=new),
            dataclasses.replace(spec, cases=[c for c in spec.cases if c is not new[0]]))


@pytest.mark.parametrize("unit", TOUCHED)
def test_the_stand_in_passes_every_case(target, libs, tmp_path, unit):
    r = _run(target, load_spec(target, unit), libs["plain"], tmp_path)
    assert r.ok, r.summary + "\n" + r.diagnostics


@pytest.mark.parametrize("name", sorted(FLAWS))
def test_each_new_case_refuses_its_flaw(target, libs, tmp_path, name):
    unit, _, check, label, masked = FLAWS[name]
    spec = load_spec(target, unit)
    alone, older = _split(spec, label)
    r = _run(target, spec, libs[name], tmp_path / "all")
    assert not r.ok, r.summary
    if not masked:
        # the spec before the new case let this flaw through; with it, the new case is what refuses it
        assert r.check == check and label in r.summary, r.summary + "\n" + r.diagnostics
        assert _run(target, older, libs[name], tmp_path / "older").ok
    r1 = _run(target, alone, libs[name], tmp_path / "alone")
    assert not r1.ok and r1.check == check, r1.summary + "\n" + r1.diagnostics


def test_every_runtime_scenario_waits_on_every_unit_it_calls(target):
    # scenario_uses builds case 0 alone unless `uses` is given: a later case calling another unit would run
    # while that unit is a placeholder, and its refusal would be blamed on this one
    for unit, spec in load_specs(target).items():
        if not is_scenario(spec):
            continue
        called = set()
        for run in prepare(target, spec, None, [1, 2]):
            called |= run.script.functions()
        assert called - {unit} <= set(scenario_uses(target, spec)), unit
