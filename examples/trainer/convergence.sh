#!/usr/bin/env bash
# The convergence study of docs/CONVERGENCE.md: every composition trained with 4 MPI ranks,
# the same seed, batch, learning rate and epochs; per-epoch CSVs in docs/results/conv_<name>.csv,
# the plot in docs/convergence.png, the table on stdout.
#
#   bash examples/trainer/convergence.sh [--epochs N] [--build DIR]      (default 5 epochs, build-conv/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
epochs=5
build="$root/build-conv"
while (($#)); do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *) echo "convergence.sh: unknown option '$1' (use --epochs N, --build DIR)" >&2; exit 2 ;;
  esac
done
runs=(train_dense train_fp16 train_bf16 train_csc train_topk train_gtopk train_oktopk train_hier train_funneled train_concurrent train_chained train_easgd)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_BUILD_TESTS=OFF -DGFLOW_BUILD_BENCH=OFF >/dev/null
fi
echo "convergence: building ${#runs[@]} experiments in $build" >&2
cmake --build "$build" -j"$(nproc)" --target "${runs[@]}" >/dev/null
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
mkdir -p "$root/docs/results"
start=$SECONDS
for i in "${!runs[@]}"; do
  r="${runs[$i]}"
  echo "convergence: [$((i + 1))/${#runs[@]}] $r, 4 ranks, $epochs epochs (elapsed $((SECONDS - start)) s)" >&2
  mpiexec "${mpi_flags[@]}" -n 4 "$build/examples/$r" --epochs "$epochs" --seed 1 --csv "$root/docs/results/conv_$r.csv" | tee "$root/docs/results/conv_$r.log"
done
# Run-to-run noise: dense fp32 again with another seed (initialisation and shuffling).
echo "convergence: noise reference train_dense --seed 2 (elapsed $((SECONDS - start)) s)" >&2
mpiexec "${mpi_flags[@]}" -n 4 "$build/examples/train_dense" --epochs "$epochs" --seed 2 --csv "$root/docs/results/conv_train_dense_seed2.csv" |
  tee "$root/docs/results/conv_train_dense_seed2.log"
echo "convergence: done in $((SECONDS - start)) s" >&2
python3 "$root/examples/trainer/plot_convergence.py" "$root"/docs/results/conv_train_*.csv -o "$root/docs/convergence.png"
