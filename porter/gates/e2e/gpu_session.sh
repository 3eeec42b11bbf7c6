#!/usr/bin/env bash
# One device-machine session for the e2e gate (run from the repository root).
# Installs the carried wheels (.whl/), puts the carried minimoe fixture (.carry/)
# in place, then runs the steps in $E2E_STEPS (default: minimoe):
#   minimoe   calibrate minimoe's e2e rule on the GPU (every row of
#             targets/minimoe/e2e/variants.toml), write it, then the gate on
#             porter's scripted CUDA backend (must pass)
#   ds4prep   ds4 reduced: the synthetic 5-layer GGUF and every build
#             (CPU reference, upstream CUDA, mutants, porter's library) in $DS4_SCRATCH
#   ds4cal    ds4 reduced: run them all, print the calibration table
#   bench     the parity bench before (plain nvcc, probe on every pass: PORTER_NVCC_SPLIT=0
#             PORTER_HOST_PCH=0 PORTER_STREAM_PROBE=every-pass) and
#             after, on this machine in this call, with the isolation run (issue 15)
#   gputests  the GPU and nvcc tests of the gates (parity on the GPU, split compile, host PCH)
#   prebuild  ds4: the upstream backend and every mutants.toml rule mutant, built in parallel
#             into runs/known-good/ds4 (where `porter calibrate --known-good upstream` finds them)
#   trace     ds4: the kernel-launch trace over chunk $TRACE_CHUNK (i/n, default 1/1) of the op
#             specs and their env-knob variants, table in $OUT/trace_<i>of<n>.json
#   cal       ds4: `porter calibrate --known-good upstream` over chunk $CAL_CHUNK (i/n, default
#             1/1) of the specs, report in $OUT/calibration_<i>of<n>.json
#   mutate    `porter calibrate --mutate` on $MUTATE_TARGET (default ds4; --known-good upstream there,
#             scripted for minimoe), one unit at a time so each finished unit is merged into
#             targets/<t>/mutation.json (--write) before a time box can end the step; $PER_GPU
#             warm workers share each GPU (default 4), $MUTATE_BUDGET mutants per operator (default 3)
#   sweep     the known-good's seed sweep (`porter calibrate --seed-sets ${SEED_SETS:-20}
#             --no-mutants --no-variants --per-gpu $PER_GPU --write`) on $SWEEP_TARGET (default ds4), one
#             spec at a time, each kept in targets/<t>/seed_sweep.json as it finishes; by default the
#             specs the record has no current sweep of
#   perftable `porter dev perf-table` over chunk $CAL_CHUNK of the ds4 ops targets/ds4/perf/h200.json has
#             not measured on their current spec (--missing-from), perf mutants included; then, at no
#             GPU cost: `porter dev perf-table --target ds4 --merge targets/ds4/perf/h200.json OUT/*.json
#             --out targets/ds4/perf/h200.md` (writes h200.json beside it; then target.toml's floors)
#   fullrun   ds4: `porter run --provider reference --jobs ${JOBS:-8}` in $FULLRUN_WS (default /tmp/port-ds4),
#             inside the box; resumed from $FULLRUN_RESUME (the tarball an earlier box returned) when given, so
#             a run longer than a lease goes on in the next one; the workspace (no build outputs) and
#             $PORTER_HOME (its signing key) come back as $OUT/fullrun_ws.tgz, status as text and JSON
# $UNITS (space-separated API functions) narrows trace, cal, mutate and sweep to those specs: a re-run of the
# specs a fix touched, on the same machine as the rest of the table; $CAL_FLAGS adds flags to the
# cal step's `porter calibrate` (e.g. --no-variants where the trace already ran the variants)
# ds4 needs the checkout at $PORTER_DS4_SOURCE (default external/ds4) and ~25 GB
# free under $DS4_SCRATCH.  Results go to $OUT.  prebuild, trace and cal stop after $LONG_STEP_S
# (default 590: inside one device call); a session run in the background (setsid) may set more.
set -uo pipefail
OUT=${OUT:-/tmp/e2e-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  # once per machine: a second session started beside a running one (ds4prep in the background)
  # must not reinstall into the folder the first one imports from
  if [ ! -f /tmp/site/.porter-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    touch /tmp/site/.porter-wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  # keep the caller's path: a session started from a copy of the tree (no .whl there) imports porter's
  # dependencies from where its caller installed them
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p runs/fixtures
[ -f .carry/minimoe.gguf ] && cp .carry/minimoe.gguf runs/fixtures/minimoe.gguf
export PYTHONUNBUFFERED=1 PORTER_BUILD_CACHE=${PORTER_BUILD_CACHE:-/tmp/porter-build-cache}
export PORTER_DS4_SOURCE=${PORTER_DS4_SOURCE:-$PWD/external/ds4}
# under runs/ (ignored by git) so a warm machine keeps it between the ds4prep and ds4cal calls
DS4_SCRATCH=${DS4_SCRATCH:-$PWD/runs/ds4-e2e}
LONG_STEP_S=${LONG_STEP_S:-590}
unit_args=()
for u in ${UNITS:-}; do unit_args+=(--unit "$u"); done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2; nproc; df -h /tmp | tail -1; } 2>&1 | tee "$OUT/env.txt"
# each_unit STEP RECORD "UNIT..." COMMAND...: COMMAND with {} replaced by one unit after another, inside the
# step's time box; each finished unit's --write is already in RECORD (copied to $OUT), so a box that ends
# keeps what it measured
each_unit() {
  local step=$1 record=$2 units=$3 u left end=$(( t0 + LONG_STEP_S ))
  shift 3
  for u in $units; do
    left=$(( end - $(date +%s) )); [ "$left" -lt 30 ] && { echo "$step: no time left for $u" | tee -a "$OUT/$step.log"; continue; }
    timeout "$left" "${@//\{\}/$u}" >> "$OUT/$step.log" 2>&1
    echo "$step $u: rc $?" | tee -a "$OUT/$step.log"
    cp "$record" "$OUT/" 2>/dev/null
  done
}
for step in ${E2E_STEPS:-minimoe}; do
  t0=$(date +%s)
  # calibrate --write (mutate, sweep) runs in a workspace: a tree laid out by `git archive` is none, and every
  # unit of the step would fail on it one by one, a lease spent for nothing
  case $step in mutate|sweep)
    if ! git rev-parse --show-toplevel >/dev/null 2>&1; then
      echo "step $step: $PWD is not a git work tree, so no porter workspace (git init && git add -A && git commit there first)" \
        | tee -a "$OUT/steps.txt"
      continue
    fi ;;
  esac
  case $step in
    minimoe)
      timeout 420 python3 -m porter.commands.e2e calibrate --target minimoe --mode cuda --write \
          --scratch /tmp/minimoe-e2e --out "$OUT/minimoe_calibration.json" 2>&1 | tee "$OUT/minimoe_calibration.log"
      cp targets/minimoe/e2e/calibration.json "$OUT/" 2>/dev/null
      timeout 120 python3 -m porter.commands.e2e run --target minimoe --library scripted --scratch /tmp/minimoe-e2e 2>&1 \
          | tee "$OUT/minimoe_run.log" ;;
    ds4prep)
      timeout 590 python3 -m porter.commands.e2e prepare --target ds4 --scratch "$DS4_SCRATCH" 2>&1 | tee "$OUT/ds4_prepare.log" ;;
    ds4cal)
      timeout 590 python3 -m porter.commands.e2e calibrate --target ds4 --scratch "$DS4_SCRATCH" \
          --out "$OUT/ds4_calibration.json" 2>&1 | tee "$OUT/ds4_calibration.log"
      for d in "$DS4_SCRATCH"/out/*/; do tail -3 "$d/stderr.txt" > "$OUT/ds4_stderr_$(basename "$d").txt" 2>/dev/null; done ;;
    bench)
      PORTER_NVCC_SPLIT=0 PORTER_HOST_PCH=0 PORTER_STREAM_PROBE=every-pass timeout 300 python3 -m porter.bench.parity --paths warm \
          --scratch-reps 0 --json "$OUT/bench_before.json" 2>&1 | tee "$OUT/bench_before.log"
      timeout 420 python3 -m porter.bench.parity --reps 9 --scratch-reps 1 --isolation \
          --json "$OUT/bench_after.json" 2>&1 | tee "$OUT/bench_after.log" ;;
    gputests)
      timeout 590 python3 -m pytest -q -rs tests/test_parity_gpu.py tests/test_host_pch.py tests/test_nvcc_split.py \
          2>&1 | tail -40 | tee "$OUT/gputests.log" ;;
    prebuild)
      timeout "$LONG_STEP_S" python3 - <<'PY' 2>&1 | tee "$OUT/prebuild.log"
import time
from porter.calibration.libraries import UpstreamLibraries
from porter.gates.mutants import rule_mutants
from porter.target import load_target
t = load_target(".", "ds4")
libs, ms, t0 = UpstreamLibraries(t), rule_mutants(t), time.monotonic()
libs.prepare(ms)
bad = libs.failed()
print(f"{len(ms) + 1} upstream builds in {time.monotonic() - t0:.0f} s, {len(bad)} failed")
for k, v in bad.items():
    print(f"FAILED {k}: {str(v)[:300]}")
PY
      ;;
    trace)
      chunk=${TRACE_CHUNK:-1/1}
      timeout "$LONG_STEP_S" python3 -m porter.calibration.trace --target ds4 --chunk "$chunk" "${unit_args[@]}" \
          --json "$OUT/trace_${chunk/\//of}.json" 2>&1 | tee "$OUT/trace_${chunk/\//of}.log" ;;
    cal)
      chunk=${CAL_CHUNK:-1/1}
      timeout "$LONG_STEP_S" python3 -m porter calibrate --target ds4 --known-good upstream --jobs 6 --chunk "$chunk" "${unit_args[@]}" ${CAL_FLAGS:-} \
          --report "$OUT/calibration_${chunk/\//of}.json" 2>&1 | tee "$OUT/calibration_${chunk/\//of}.log" ;;
    mutate)
      mt=${MUTATE_TARGET:-ds4}
      kg=$([ "$mt" = ds4 ] && echo upstream || echo scripted)
      each_unit mutate "targets/$mt/mutation.json" \
          "${UNITS:-$(python3 -c "from porter.spec import load_specs; from porter.target import load_target; print(' '.join(sorted(load_specs(load_target('.', '$mt')))))")}" \
          python3 -m porter calibrate --target "$mt" --known-good "$kg" --mutate --unit {} \
          --budget "${MUTATE_BUDGET:-3}" --per-gpu "${PER_GPU:-4}" --jobs 16 --write --report "$OUT/mutate_{}.json" ;;
    sweep)
      # by default the specs whose recorded sweep is missing or stale
      st=${SWEEP_TARGET:-ds4}
      kg=$([ "$st" = ds4 ] && echo upstream || echo scripted)
      each_unit sweep "targets/$st/seed_sweep.json" "${UNITS:-$(python3 -c "
from porter.calibration import sweep_record; from porter.spec import load_specs; from porter.target import load_target
t = load_target('.', '$st'); s = sweep_record.standing(t, {u: x.sha256 for u, x in load_specs(t).items()})
print(' '.join(s['unswept'] + s['stale']))")}" \
          python3 -m porter calibrate --target "$st" --known-good "$kg" --unit {} --seed-sets "${SEED_SETS:-20}" \
          --no-mutants --no-variants --per-gpu "${PER_GPU:-4}" --jobs 16 --no-ledger --write --report "$OUT/sweep_{}.json" ;;
    perftable)
      # the ops of ds4's recorded perf table not yet measured on their current spec; the table is rewritten
      # after every row, so a time box keeps what it measured, and `perf-table --merge` joins it
      chunk=${CAL_CHUNK:-1/1}
      timeout "$LONG_STEP_S" python3 -m porter dev perf-table --target ds4 --regimes '' \
          --missing-from targets/ds4/perf/h200.json --chunk "$chunk" "${unit_args[@]}" \
          --out "$OUT/perf_table_${chunk/\//of}.md" 2>&1 | tee "$OUT/perf_table_${chunk/\//of}.log" ;;
    fullrun)
      ws=${FULLRUN_WS:-/tmp/port-ds4}
      export PORTER_HOME=${PORTER_HOME:-/tmp/porter-home}
      if [ -n "${FULLRUN_RESUME:-}" ]; then
        tar -xzf "$FULLRUN_RESUME" -C / || { echo "fullrun: cannot unpack $FULLRUN_RESUME" | tee -a "$OUT/steps.txt"; continue; }
      elif [ ! -d "$ws" ]; then
        python3 -m porter init "$ws" --target ds4 --source "$PORTER_DS4_SOURCE" 2>&1 | tee -a "$OUT/fullrun.log"
      fi
      t_run=$(date +%s)
      timeout "$LONG_STEP_S" python3 -m porter -C "$ws" run --target ds4 --provider reference --jobs "${JOBS:-8}" \
          >> "$OUT/fullrun.log" 2>&1
      echo "fullrun: rc $?, $(( $(date +%s) - t_run )) s in this box" | tee -a "$OUT/fullrun.log"
      python3 -m porter -C "$ws" status --target ds4 > "$OUT/fullrun_status.txt" 2>&1
      python3 -m porter -C "$ws" status --target ds4 --json > "$OUT/fullrun_status.json" 2>/dev/null
      # the builds are made again from the sources; the history, ledger and key are what a resume needs
      tar -czf "$OUT/fullrun_ws.tgz" --exclude='*.so' --exclude='*.o' --exclude="${ws#/}/runs/parity" \
          -C / "${ws#/}" "${PORTER_HOME#/}" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "step $step: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.txt"
done
