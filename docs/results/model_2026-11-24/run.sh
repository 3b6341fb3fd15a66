#!/usr/bin/env bash
# The cost model's check, as measured for docs/BENCHMARKS.md (2026-11-24, later session):
# 5 runs of bench/run model at P = 2, 4, 8 on shared memory, then 3 at each P on bench/netem.sh
# (1 Gbit/s); each run fits, measures the local terms and the exchanges, and predicts.
#   sudo docs/results/model_2026-11-24/run.sh    (from the repository root; ~20 min on 2 cores)
set -euo pipefail
out="$(dirname "$0")"
for i in ${SHM_RUNS:-1 2 3 4 5}; do
  for p in 2 4 8; do
    [[ -s "$out/shm_p${p}_run$i.jsonl" ]] && continue  # done already
    echo "shared memory: run $i, P = $p" >&2
    bench/run model --layout resnet50 --ranks "$p" --reps 15 --iters 15 > "$out/shm_p${p}_run$i.jsonl" 2> "$out/shm_p${p}_run$i.log"
  done
done
for i in ${NETEM_RUNS:-1 2 3}; do
  for p in 2 4 8; do
    [[ -s "$out/netem_p${p}_run$i.jsonl" ]] && continue  # done already
    echo "netem 1 Gbit/s: run $i, P = $p" >&2
    bench/netem.sh down 8 > /dev/null 2>&1 || true  # whatever an earlier run left
    bench/netem.sh up "$p" 1gbit > /dev/null
    bench/netem.sh run "$p" -- model --layout resnet50 --reps 15 --iters 15 > "$out/netem_p${p}_run$i.jsonl" 2> "$out/netem_p${p}_run$i.log" || true
    bench/netem.sh down "$p" > /dev/null
  done
done
