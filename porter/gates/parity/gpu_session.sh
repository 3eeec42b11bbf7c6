#!/usr/bin/env bash
# One device-machine session for the parity gate (run from the repository root):
# installs the carried wheels (.whl/), puts the carried fixture (.carry/) in place,
# then runs the steps in $PARITY_STEPS (default: smoke gpu bench):
#   smoke  one known-good unit through the gate, diagnostics printed in full
#   gpu    tests/test_parity_gpu.py = calibration of every minimoe spec + mutant corpus
#   bench  candidate text -> parity verdict timing (porter.gates.parity.bench)
#   cli    `porter calibrate` through the CLI, with ledger records, then the gate as the loop calls it
#   ci     the no-GPU parity tests, for comparison
#   ds4    stretch: build upstream ds4_cuda.cu (carried external/ds4) and a mutated copy,
#          calibrate targets/ds4/parity against them
# Results go to $OUT (the device tool brings that folder back).
set -uo pipefail
OUT=${OUT:-/tmp/parity-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
mkdir -p runs/fixtures
[ -f .carry/minimoe.gguf ] && cp .carry/minimoe.gguf runs/fixtures/minimoe.gguf
export PYTHONUNBUFFERED=1 PORTER_BUILD_CACHE=${PORTER_BUILD_CACHE:-/tmp/porter-build-cache}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2
  command -v compute-sanitizer; python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; nproc; } 2>&1 | tee "$OUT/env.txt"
for step in ${PARITY_STEPS:-smoke gpu bench}; do
  case $step in
    smoke) timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.log"
import time
from pathlib import Path
from porter.target import load_target
from porter.calibrate import known_good_sources
from porter.gates.parity.libbuild import LibBuilder
from porter.gates.parity.spec import load_spec
from porter.gates.parity.gate import run_spec
t = load_target(Path("."), "minimoe")
good, _, _ = known_good_sources(t, "scripted")
t0 = time.time(); lib = LibBuilder(t, Path("/tmp/porter-build-cache")).library(good); print(f"built {lib} in {time.time()-t0:.1f}s")
for u in ("mini_gpu_swiglu_tensor", "mini_gpu_matmul_q8_0_tensor"):
    t0 = time.time(); r = run_spec(t, load_spec(t, u), lib, workspace=Path("."), keep=False)
    print(f"{u}: ok={r.ok} {time.time()-t0:.1f}s\n{r.summary}\n{r.diagnostics}\nchild={r.evidence.get('child')}\ndevice={r.evidence.get('device')}\ntiming={r.evidence.get('timing')}\n")
PY
    ;;
    gpu) PORTER_PARITY_REPORT="$OUT/calibration.json" timeout 400 python3 -m pytest -q -s -rs -p no:cacheprovider \
           tests/test_parity_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" ;;
    bench) timeout 180 python3 -m porter.gates.parity.bench --reps 7 --scratch-reps 2 --json "$OUT/bench.json" 2>&1 \
           | tee "$OUT/bench.log" ;;
    ds4) timeout 420 bash -c '
      set -x; mkdir -p /tmp/ds4; ls /usr/local/cuda/include/cublas_v2.h
      sed "s/out\[i\] = s \* u \* weight;/out[i] = s * u;  \/\/ porter mutant: weight ignored/" \
          external/ds4/ds4_cuda.cu > /tmp/ds4/ds4_cuda_mut.cu
      grep -c "porter mutant" /tmp/ds4/ds4_cuda_mut.cu
      F="-O2 -arch=sm_90 -Xcompiler -fPIC -shared -I external/ds4"
      t0=$(date +%s)
      nvcc $F -o /tmp/ds4/libds4_cuda.so external/ds4/ds4_cuda.cu -lcublas & nvcc $F -o /tmp/ds4/libds4_mut.so /tmp/ds4/ds4_cuda_mut.cu -lcublas & wait
      echo "ds4 builds: $(( $(date +%s) - t0 )) s"; ls -la /tmp/ds4
      export PORTER_DS4_SOURCE=$PWD/external/ds4
      python3 -m porter.calibrate --target ds4 --known-good /tmp/ds4/libds4_cuda.so --no-ledger --timing-reps 5
      python3 -c "
from pathlib import Path
from porter.target import load_target
from porter.gates.parity.spec import load_spec
from porter.gates.parity.gate import run_spec
t = load_target(Path(\".\"), \"ds4\")
for unit in (\"ds4_gpu_swiglu_tensor\", \"ds4_gpu_rms_norm_plain_rows_tensor\"):
    r = run_spec(t, load_spec(t, unit), Path(\"/tmp/ds4/libds4_mut.so\"), workspace=Path(\".\"))
    print(\"MUTANT (swiglu weight ignored) vs\", unit, \"ok=\", r.ok, r.summary)
"' 2>&1 | tee "$OUT/ds4.log" ;;
    cli) { timeout 300 python3 -m porter -C . calibrate --target minimoe --report "$OUT/calibration_cli.json" \
             --build-dir "$PORTER_BUILD_CACHE"; echo "porter calibrate exit status $?"
           timeout 120 python3 - <<'PY'
import json, os
from pathlib import Path
from porter.gates import parity
from porter.ledger import Ledger
from porter.target import load_target
t = load_target(Path("."), "minimoe")
recs = [r for r in Ledger(Path(".")).records() if r.get("kind") == "calibration"]
print(len(recs), "calibration records in the ledger,", sum(bool(r["ok"]) for r in recs), "ok; verify:", Ledger(Path(".")).verify())
lib = Path(json.load(open(os.path.join(os.environ.get("OUT", "/tmp/parity-out"), "calibration_cli.json")))["library"])
for u in ("mini_gpu_swiglu_tensor", "mini_gpu_routed_gate_up_iq2_xxs_tensor"):
    r = parity.check(t, u, lib, Path("."), candidate_sha256="0" * 64)
    probes = [p["probe"] for c in r.evidence["cases"] for p in c["passes"]]
    print(u, "|", r.summary, "| calibration:", r.evidence["calibration"], "| probes:",
          {k: probes.count(k) for k in set(probes)})
PY
         } 2>&1 | tee "$OUT/cli.log" ;;
    ci) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_parity_compare.py 2>&1 | tail -5 | tee "$OUT/ci.log" ;;
  esac
done
