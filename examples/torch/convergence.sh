#!/usr/bin/env bash
# The libtorch CNN's convergence study (docs/CONVERGENCE.md, "CNN against seed noise"): every
# composition trained with 4 MPI ranks, the same epochs, batch and learning rate, for each of
# several seeds (initialisation and shuffling). Seed-major order, so an interrupted study still
# has whole seeds. Per-run CSVs and logs in docs/results/torch/, then the summary table (mean,
# standard deviation, difference to dense with its uncertainty) and docs/convergence_torch.png.
#
#   bash examples/torch/convergence.sh [--epochs N] [--seeds "1 2 3"] [--build DIR] [--only "torch_dense ..."]
#                                      [--flags "--batch 16 --accumulate 2" --suffix acc2] [--out DIR]
# --flags adds trainer flags to every run and --suffix names those runs <name>_<suffix>_s<seed>
# (e.g. the gradient-accumulation study of docs/CONVERGENCE.md); --out changes the results folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
epochs=3
seeds="1 2 3"
build="$root/build"
runs=(torch_dense torch_fp16 torch_csc torch_topk torch_gtopk torch_oktopk torch_funneled)
flags=""
suffix=""
out="$root/docs/results/torch"
while (($#)); do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --only) read -r -a runs <<<"$2"; shift 2 ;;
    --flags) flags="$2"; shift 2 ;;
    --suffix) suffix="_$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "convergence.sh: unknown option '$1' (use --epochs N, --seeds \"1 2 3\", --build DIR, --only \"names\", --flags \"...\", --suffix S, --out DIR)" >&2; exit 2 ;;
  esac
done
for r in "${runs[@]}"; do
  [[ -x "$build/examples/$r" ]] || { echo "convergence.sh: $build/examples/$r is missing: cmake --build $build --target ${runs[*]}" >&2; exit 2; }
done
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
mkdir -p "$out"
read -r -a flag_list <<<"$flags"
read -r -a seed_list <<<"$seeds"
total=$((${#seed_list[@]} * ${#runs[@]}))
k=0
start=$SECONDS
for s in "${seed_list[@]}"; do
  for r in "${runs[@]}"; do
    k=$((k + 1))
    n="${r}${suffix}"
    echo "convergence: [$k/$total] $n seed $s, 4 ranks, $epochs epochs ${flags} (elapsed $((SECONDS - start)) s)" >&2
    mpiexec "${mpi_flags[@]}" -n 4 "$build/examples/$r" --epochs "$epochs" --seed "$s" "${flag_list[@]}" --csv "$out/${n}_s$s.csv" >"$out/${n}_s$s.log"
    grep RESULT "$out/${n}_s$s.log" >&2
  done
done
echo "convergence: done in $((SECONDS - start)) s" >&2
if [[ "$out" == "$root/docs/results/torch" ]]; then
  python3 "$root/examples/torch/convergence_table.py" "$out" -o "$root/docs/convergence_torch.png"
else
  python3 "$root/examples/torch/convergence_table.py" "$out" -o "$out/convergence.png"
fi
