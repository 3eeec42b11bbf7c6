"""The port's accuracy in the field's units: mean KL divergence and same-top-token rate of its logits against
upstream's, over every position of a long prefill (llama.cpp's `llama-perplexity --kl-divergence` reports the
same figures; its BF16-vs-FP16 runs read about 2.5e-5 mean KLD and 99.7% same top token).

The target's driver runs each GPU build (upstream's backend and the port's, the throughput gate's builds)
through one prefill that writes the logits of every prompt position, computed by that build's own output-head
kernels, to a file (`runner.logit_rows(backend) -> Path`).  A file is a sequence of records, one per position
in order: int32 position, then n_vocab float32 logits.  porter reads the files the sandboxed engine wrote
(it never loads the engine's code), block by block: two runs of ~2k x 129k floats are a GB each, too big to
hold side by side in float64.  Upstream is run twice, so its own run-to-run spread (the A/A figures) stands
beside the port's: the floor a perfect port reads.

These figures are reported beside the e2e verdict, not as one: no threshold for them has been measured on
known-good and broken backends, and porter picks none (docs/accuracy.md).  The verdict on the port's
correctness stays the calibrated NMSE rule of the e2e gate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from porter.errors import PorterError
from porter.gates.e2e import cbuild
from porter.gates.e2e.compare import agreement_summary, kld_rows
from porter.gates.e2e.throughput import CANDIDATE, UPSTREAM

MIN_POSITIONS = 2000  # the floor: fewer scored positions say too little about a mean KLD
BLOCK_ROWS = 32  # rows compared at a time (a block of 129k-wide rows in float64 is ~33 MB per array)
LLAMA_CPP = "llama.cpp BF16 vs FP16: ~2.5e-5, ~99.7%"
RULE = "reported beside the verdict, which is the calibrated e2e NMSE rule's"


def _dtype(n_vocab: int) -> np.dtype:
    return np.dtype([("pos", "<i4"), ("logits", "<f4", (n_vocab,))])


def dump_rows(path: Path, n_vocab: int, max_rows: int) -> int:
    """The number of records in an engine's dump, or a PorterError naming what is wrong with it."""
    rec = _dtype(n_vocab).itemsize
    with cbuild.open_engine_output(path, max_rows * rec) as (_f, size):
        pass
    return _records_in(path, size, n_vocab)


def _records_in(path: Path, size: int, n_vocab: int) -> int:
    rec = _dtype(n_vocab).itemsize
    if size == 0 or size % rec:
        raise PorterError(f"{Path(path).name}: {size} bytes is not a whole number of {rec}-byte logits records "
                          f"(int32 position + {n_vocab} float32): a truncated or foreign file")
    return size // rec


def read_blocks(path: Path, n_vocab: int, max_rows: int, block_rows: int = BLOCK_ROWS):
    """Yield [rows][n_vocab] float32 blocks of a dump in position order; PorterError for a file that is not
    records of positions 0, 1, 2, ... (a missing, repeated or reordered position names itself)."""
    dt = _dtype(n_vocab)
    with cbuild.open_engine_output(path, max_rows * dt.itemsize) as (f, size):
        n = _records_in(path, size, n_vocab)
        done = 0
        while done < n:
            want = min(block_rows, n - done)
            raw = f.read(want * dt.itemsize)
            if len(raw) != want * dt.itemsize:
                raise PorterError(f"{Path(path).name}: changed size while read")
            recs = np.frombuffer(raw, dtype=dt)
            expect = np.arange(done, done + want, dtype=np.int32)
            bad = np.flatnonzero(recs["pos"] != expect)
            if bad.size:
                i = int(bad[0])
                raise PorterError(f"{Path(path).name}: record {done + i} is position {int(recs['pos'][i])}, "
                                  f"expected {done + i} (positions must run 0, 1, 2, ... once each)")
            yield recs["logits"]
            done += want


def agreement_of_dumps(ref: Path, cand: Path, n_vocab: int, expect_rows: int,
                       block_rows: int = BLOCK_ROWS) -> dict:
    """compare.logit_agreement of two dumps, streamed: the candidate's divergence from the reference
    (KL(P_ref || P_cand) per position) and the share of positions whose top tokens agree.  Both must hold
    exactly expect_rows positions; the reference's fault is a ReferenceFailure, the candidate's a PorterError."""
    from porter.gates.e2e.compare import ReferenceFailure

    try:
        n_ref = dump_rows(ref, n_vocab, expect_rows)
    except PorterError as exc:
        raise ReferenceFailure(f"the reference's logits: {exc}") from None
    if n_ref != expect_rows:
        raise ReferenceFailure(f"the reference's logits hold {n_ref} positions, expected {expect_rows}")
    n_cand = dump_rows(cand, n_vocab, expect_rows)
    if n_cand != expect_rows:
        raise PorterError(f"{Path(cand).name}: {n_cand} positions of logits, expected {expect_rows}")
    klds, sames = [], []
    for r, c in zip(read_blocks(ref, n_vocab, expect_rows, block_rows), read_blocks(cand, n_vocab, expect_rows,
                                                                                     block_rows)):
        k, s = kld_rows(r, c)
        klds.append(k)
        sames.append(s)
    return agreement_summary(np.concatenate(klds), np.concatenate(sames))


def measure(runner, n_vocab: int, positions: int, log=print) -> dict:
    """Upstream twice (its A/A floor), then the port, each a prefill of `positions` tokens whose every logits
    row the engine dumps; the dumps are removed once read.  Returns the record's `accuracy`:
    {positions, mean_kld, p99_kld, max_kld, same_top, upstream_aa: {...}, rule}, or {skipped: why} where
    upstream's side failed, or {failed: why, upstream_aa} where the port's run or dump is at fault."""
    from porter.gates.e2e.compare import ReferenceFailure

    if positions < MIN_POSITIONS:
        return {"skipped": f"a prefill of {positions} positions, fewer than the {MIN_POSITIONS} the figures need"}
    dumps: list[Path] = []
    try:
        try:
            dumps.append(Path(runner.logit_rows(UPSTREAM)))
            dumps.append(Path(runner.logit_rows(UPSTREAM)))
            aa = agreement_of_dumps(dumps[0], dumps[1], n_vocab, positions)
        except (PorterError, ReferenceFailure) as exc:
            return {"skipped": f"upstream's logits: {exc}"[:300]}
        dumps.pop().unlink(missing_ok=True)
        log(f"accuracy: upstream against itself: {_figures(aa)}")
        try:
            dumps.append(Path(runner.logit_rows(CANDIDATE)))
            res = agreement_of_dumps(dumps[0], dumps[1], n_vocab, positions)
        except ReferenceFailure as exc:
            return {"skipped": f"upstream's logits: {exc}"[:300]}
        except PorterError as exc:
            return {"failed": f"the port's logits: {exc}"[:300], "upstream_aa": stored(aa)}
        log(f"accuracy: the port against upstream: {_figures(res)}")
        return {**stored(res), "upstream_aa": stored(aa), "rule": RULE}
    finally:
        for d in dumps:
            d.unlink(missing_ok=True)


def stored(a: dict) -> dict:
    """The figures as the record keeps them: standard JSON has no infinity (status --json is read by jq), so
    a divergence that is infinite -- a row of the port's logits not finite -- is None there, and
    non_finite_rows says how many rows made it so."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in a.items()}


def _num(v: float | None) -> str:
    return "inf" if v is None or not math.isfinite(v) else ("0" if v == 0 else f"{v:.2g}")


def _figures(a: dict) -> str:
    return (f"mean KLD {_num(a['mean_kld'])} (p99 {_num(a['p99_kld'])}, max {_num(a['max_kld'])}), "
            f"same top token {100 * a['same_top']:.1f}% over {a['positions']} positions")


def accuracy_line(acc: dict | None) -> str | None:
    """status's line for a throughput record's `accuracy`; None where the record has none."""
    if not acc:
        return None
    if acc.get("skipped"):
        return f"accuracy: not measured ({acc['skipped']})"
    if acc.get("failed"):
        return f"accuracy: FAILED: {acc['failed']}"
    if acc.get("non_finite_rows") and isinstance(acc.get("positions"), int):
        return (f"accuracy: the port's logits are not finite on {acc['non_finite_rows']} of {acc['positions']} "
                f"positions (infinite KL divergence from upstream's); {RULE}")
    if not all(isinstance(acc.get(k), (int, float)) for k in ("positions", "mean_kld", "p99_kld", "max_kld",
                                                            "same_top")):
        return "accuracy: not measured (a record without the figures the gate writes)"
    aa = acc.get("upstream_aa") or {}
    floor = f"; upstream against itself {_num(aa['mean_kld'])}, {100 * aa['same_top']:.1f}%" \
        if isinstance(aa.get("mean_kld"), (int, float)) and isinstance(aa.get("same_top"), (int, float)) else ""
    return (f"accuracy: mean KLD {_num(acc['mean_kld'])} (p99 {_num(acc['p99_kld'])}), same top token "
            f"{100 * acc['same_top']:.1f}% over {acc['positions']} positions vs upstream{floor} "
            f"({LLAMA_CPP}); {RULE}")
