#!/usr/bin/env bash
# One device lease, several GPUs, each its own gpu_session.sh in the background (run from the repository root).
#   bash porter/gates/e2e/lease.sh start 'E2E_STEPS=sweep SWEEP_TARGET=minimoe' 'E2E_STEPS=mutate MUTATE_TARGET=minimoe'
#       GPU i gets the i-th argument as its environment, a copy of this tree under /tmp/lease/w<i> made a git work
#       tree (calibrate --write needs one), and OUT=/tmp/lease/o<i>.  The copies outlive the call: the next call
#       lays the working tree anew, the background sessions keep theirs.
#   bash porter/gates/e2e/lease.sh poll 400
#       waits until every session has ended or 400 s have passed, prints each one's steps, and packs
#       /tmp/lease/o* into $OUT/lease.tgz (what a session measured comes back even when the lease then ends).
# A lease goes back when no call comes for about 30 s: chain the polls.  The wheels (.whl/) and bubblewrap's
# Debian package (.deb/) are carried as the device README says; gpu_session.sh installs the wheels.
set -u
L=/tmp/lease
case ${1:-} in
  start)
    shift
    if ! command -v bwrap >/dev/null && ls .deb/bubblewrap_*.deb >/dev/null 2>&1; then
      mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap_*.deb /tmp/bw
    fi
    export PATH=/tmp/bw/usr/bin:$PATH
    command -v bwrap >/dev/null || { echo "lease: no bwrap (carry .deb/bubblewrap_*.deb)"; exit 1; }
    nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
    i=0
    for spec in "$@"; do
      rm -rf "$L/w$i" "$L/o$i"; mkdir -p "$L/w$i" "$L/o$i"
      tar -cf - --exclude=./.git . | tar -xf - -C "$L/w$i"
      (cd "$L/w$i" && git init -q && git add -A && git -c user.email=lease@porter -c user.name=lease commit -qm lease) \
        || { echo "lease: cannot make $L/w$i a work tree"; exit 1; }
      (cd "$L/w$i" && CUDA_VISIBLE_DEVICES=$i OUT="$L/o$i" setsid nohup env $spec bash -c \
        'bash porter/gates/e2e/gpu_session.sh; touch "$OUT/DONE"' > "$L/o$i/session.log" 2>&1 < /dev/null &)
      echo "GPU $i: $spec"
      i=$((i + 1))
    done ;;
  poll)
    end=$(( $(date +%s) + ${2:-400} ))
    while [ "$(date +%s)" -lt "$end" ]; do
      left=0
      for o in "$L"/o*; do [ -f "$o/DONE" ] || left=1; done
      [ "$left" = 0 ] && break
      sleep 10
    done
    for o in "$L"/o*; do
      echo "== $o $([ -f "$o/DONE" ] && echo done || echo running)"
      cat "$o/steps.txt" 2>/dev/null; grep -h ": rc " "$o"/*.log 2>/dev/null | tail -20
    done
    uptime
    mkdir -p "${OUT:-/tmp/lease-out}" && tar -czf "${OUT:-/tmp/lease-out}/lease.tgz" -C "$L" $(cd "$L" && ls -d o*) ;;
  *) echo "usage: lease.sh start 'ENV...' ['ENV...' ...] | lease.sh poll SECONDS"; exit 2 ;;
esac
