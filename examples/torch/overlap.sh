#!/usr/bin/env bash
# How much of the exchange hides behind libtorch's backward (docs/BENCHMARKS.md, "6. Overlap", "A
# real backward"): each binary at 4 ranks (--ranks) with --probe N (N iterations of compute alone, then N
# of exchange alone, before one short training epoch whose iterations are the overlapped time),
# the variants interleaved, R rounds. Run it alone on the machine (a timing).
#
#   bash examples/torch/overlap.sh [--rounds R] [--probe N] [--ranks P] [--only "torch_dense ..."] [--build DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds=2
probe=30
ranks=4
runs=(torch_dense torch_funneled torch_concurrent torch_chained)
build="$root/build"
while (($#)); do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --probe) probe="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --only) read -r -a runs <<<"$2"; shift 2 ;;
    *) echo "overlap.sh: unknown option '$1' (use --rounds R, --probe N, --ranks P, --only \"names\", --build DIR)" >&2; exit 2 ;;
  esac
done
for r in "${runs[@]}"; do
  [[ -x "$build/examples/$r" ]] || { echo "overlap.sh: $build/examples/$r is missing: cmake --build $build --target ${runs[*]}" >&2; exit 2; }
done
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
for ((k = 1; k <= rounds; k++)); do
  for r in "${runs[@]}"; do
    echo "overlap: round $k/$rounds $r" >&2
    mpiexec "${mpi_flags[@]}" -n "$ranks" "$build/examples/$r" --epochs 1 --train-limit 12800 --probe "$probe" | grep '^RESULT '
  done
done
