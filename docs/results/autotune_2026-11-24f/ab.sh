#!/usr/bin/env bash
# A/B of the tuner's probing: old = sequential probes (02c4afa), new = round-robin probes; both
# with the interleaved-rounds bench. Usage: ab.sh LAYOUT REPEATS [OLD_BUILD]
# (old build: git worktree add ../ab-old 02c4afa && (cd ../ab-old && bench/run overlap --ranks 1 --autotune --quick))
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../../.." && pwd)"
layout="$1"; reps="$2"; old="${3:-$root/../ab-old/build-bench}"
flags=(--oversubscribe --bind-to none --allow-run-as-root)
for ((r = 1; r <= reps; r++)); do
  for v in new old; do
    bin="$root/build-bench/bench/gflow_bench"; [[ $v == old ]] && bin="$old/bench/gflow_bench"
    echo "== $layout run $r $v $(date -u +%T)" >&2
    mpiexec "${flags[@]}" -n 4 "$bin" overlap --layout "$layout" --autotune --compute-ratio 0.5,1,2 \
      > "$here/${layout}_4_${v}_r$r.jsonl" 2> "$here/${layout}_4_${v}_r$r.log"
    grep -h 'autotuned' "$here/${layout}_4_${v}_r$r.log" >&2 || true
  done
done
