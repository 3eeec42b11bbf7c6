"""Benchmark: time from a candidate's answer text to its parity verdict (GPU machine).

    python -m porter.gates.parity.bench [--unit U] [--reps N] [--scratch-reps M] [--json FILE]

A throw-away workspace holds minimoe with every unit ported (the scripted good
answers).  Each measured attempt takes the unit's answer text with a fresh
nonce in its code (so the unit really recompiles) through what the loop does:
extract -> static gate -> build gate (this unit compiled alone, everything else
linked from cached objects) -> parity gate.  "scratch" does the same with an
empty build cache: the whole backend is compiled before the link.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from porter.calibration.libraries import sources_from
from porter.calibration.mutants import scripted_answers
from porter.extract import extract_unit_source
from porter.gates import parity
from porter.gates.driver import Candidate, GateContext, refusal, run_gates
from porter.target import load_target

REPO = Path(__file__).resolve().parents[3]


def _workspace(repo: Path, tmp: Path) -> Path:
    ws = tmp / "ws"
    shutil.copytree(repo / "targets" / "minimoe", ws / "targets" / "minimoe",
                    ignore=shutil.ignore_patterns("ported", "__pycache__"))
    fx = repo / "runs" / "fixtures" / "minimoe.gguf"
    if fx.is_file():
        (ws / "runs" / "fixtures").mkdir(parents=True)
        shutil.copy(fx, ws / "runs" / "fixtures" / "minimoe.gguf")
    return ws


def _pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def attempt(target, unit: str, text: str, cache: Path, workspace: Path) -> dict:
    """Candidate text -> verdict through the one gate driver, with each stage's time."""
    t0 = time.monotonic()
    cand = Candidate.of(unit, extract_unit_source(text, unit, target))
    t = {"extract": time.monotonic() - t0}
    stamps = [time.monotonic()]
    results = run_gates(cand, GateContext(target, workspace, build_cache=cache), gates=("static", "build", "parity"),
                        on_result=lambda r: stamps.append(time.monotonic()))
    by = {r.gate: r for r in results}
    for k, r in enumerate(results):
        t[r.gate] = stamps[k + 1] - stamps[k]
    refused = refusal(results)
    if refused is not None and refused.gate != "parity":
        raise SystemExit(f"{refused.gate} gate refused the benchmark candidate: {refused.summary}\n{refused.diagnostics}")
    b, p = by["build"], by["parity"]
    t.update(total=time.monotonic() - t0, ok=p.ok, parity_summary=p.summary,
             compile_s=b.evidence.get("compile_seconds"), others_s=b.evidence.get("others_compile_seconds"),
             link_s=b.evidence.get("link_seconds"), parity_child_s=p.evidence.get("child", {}).get("elapsed_s"),
             parity_prepare_s=(p.evidence.get("harness_s") or {}).get("prepare_s"))
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", default="mini_gpu_matmul_q8_0_tensor")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--scratch-reps", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)

    ok, why = parity.available()
    if not ok:
        print(f"bench: parity unavailable: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="porter-bench-"))
    ws = _workspace(REPO, tmp)
    target = load_target(ws, "minimoe")
    good, _ = sources_from(target, "scripted")
    target.ported_dir.mkdir(parents=True, exist_ok=True)
    for u, src in good.items():
        target.unit_path(u).write_text(src)
    answer = next(x for x in scripted_answers(target) if x["unit"] == a.unit and x["expect"] == "pass")
    text = (target.scripted_dir / answer["file"]).read_text()

    def with_nonce(i: int) -> str:
        return text.replace('#include "mini_cuda.cuh"', f'#include "mini_cuda.cuh"\n// bench nonce {time.time_ns()}-{i}', 1)

    warm = tmp / "cache-warm"
    t0 = time.monotonic()
    first = attempt(target, a.unit, with_nonce(-1), warm, ws)  # fills the object cache (and cupy's kernel cache)
    print(f"warm-up (cold cache, whole backend compiled): {time.monotonic() - t0:.1f} s, parity ok={first['ok']}")
    inc = [attempt(target, a.unit, with_nonce(i), warm, ws) for i in range(a.reps)]
    scratch = []
    for i in range(a.scratch_reps):
        scratch.append(attempt(target, a.unit, with_nonce(1000 + i), tmp / f"cache-scratch-{i}", ws))

    def summary(rows):
        tot = [r["total"] for r in rows]
        return {"n": len(rows), "median_s": statistics.median(tot), "p90_s": _pct(tot, 0.9),
                "stages_median_s": {k: statistics.median(r[k] for r in rows)
                                    for k in ("extract", "static", "build", "parity")},
                "all_ok": all(r["ok"] for r in rows)}

    res = {"unit": a.unit, "incremental": summary(inc), "scratch": summary(scratch) if scratch else None,
           "rows": {"incremental": inc, "scratch": scratch}, "cold_first_s": first["total"]}
    i, s = res["incremental"], res["scratch"]
    print(f"unit {a.unit}: candidate text -> parity verdict")
    print(f"  incremental (unit alone + link from cached objects): median {i['median_s']:.2f} s, "
          f"p90 {i['p90_s']:.2f} s over {i['n']} (stages: " +
          ", ".join(f"{k} {v:.2f}" for k, v in i["stages_median_s"].items()) + f"), all ok={i['all_ok']}")
    if s:
        print(f"  scratch (whole backend compiled, empty cache):     median {s['median_s']:.2f} s, "
              f"p90 {s['p90_s']:.2f} s over {s['n']} (stages: " +
              ", ".join(f"{k} {v:.2f}" for k, v in s["stages_median_s"].items()) + ")")
    print(f"  target < 3 s median: {'met' if i['median_s'] < 3 else 'NOT met'}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
