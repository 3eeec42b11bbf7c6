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
# ds4 needs the checkout at $PORTER_DS4_SOURCE (default external/ds4) and ~25 GB
# free under $DS4_SCRATCH.  Results go to $OUT.
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
  export PYTHONPATH=$PWD
fi
mkdir -p runs/fixtures
[ -f .carry/minimoe.gguf ] && cp .carry/minimoe.gguf runs/fixtures/minimoe.gguf
export PYTHONUNBUFFERED=1 PORTER_BUILD_CACHE=${PORTER_BUILD_CACHE:-/tmp/porter-build-cache}
export PORTER_DS4_SOURCE=${PORTER_DS4_SOURCE:-$PWD/external/ds4}
# under runs/ (ignored by git) so a warm machine keeps it between the ds4prep and ds4cal calls
DS4_SCRATCH=${DS4_SCRATCH:-$PWD/runs/ds4-e2e}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2; nproc; df -h /tmp | tail -1; } 2>&1 | tee "$OUT/env.txt"
for step in ${E2E_STEPS:-minimoe}; do
  t0=$(date +%s)
  case $step in
    minimoe)
      timeout 420 python3 -m porter.gates.e2e calibrate --target minimoe --mode cuda --write \
          --scratch /tmp/minimoe-e2e --out "$OUT/minimoe_calibration.json" 2>&1 | tee "$OUT/minimoe_calibration.log"
      cp targets/minimoe/e2e/calibration.json "$OUT/" 2>/dev/null
      timeout 120 python3 -m porter.gates.e2e run --target minimoe --library scripted --scratch /tmp/minimoe-e2e 2>&1 \
          | tee "$OUT/minimoe_run.log" ;;
    ds4prep)
      timeout 590 python3 -m porter.gates.e2e prepare --target ds4 --scratch "$DS4_SCRATCH" 2>&1 | tee "$OUT/ds4_prepare.log" ;;
    ds4cal)
      timeout 590 python3 -m porter.gates.e2e calibrate --target ds4 --scratch "$DS4_SCRATCH" \
          --out "$OUT/ds4_calibration.json" 2>&1 | tee "$OUT/ds4_calibration.log"
      for d in "$DS4_SCRATCH"/out/*/; do tail -3 "$d/stderr.txt" > "$OUT/ds4_stderr_$(basename "$d").txt" 2>/dev/null; done ;;
    *) echo "unknown step $step" ;;
  esac
  echo "step $step: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.txt"
done
