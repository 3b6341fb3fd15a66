#!/usr/bin/env bash
# The libtorch CNN's convergence study (docs/CONVERGENCE.md, "CNN against seed noise"): every
# composition trained with 4 MPI ranks, the same epochs, batch and learning rate, for each of
# several seeds (initialisation and shuffling). Seed-major order, so an interrupted study still
# has whole seeds. Every run's per-epoch rows go to docs/results/torch/runs.csv (the columns
# composition and seed, then the trainer's --csv columns; a new run of a composition and seed
# replaces the rows of the old one), its log to a temporary folder the script names; then the
# summary table (mean, standard deviation, difference to dense with its uncertainty) and
# docs/convergence_torch.png.
#
#   bash examples/torch/convergence.sh [--epochs N] [--seeds "1 2 3"] [--build DIR] [--only "torch_dense ..."]
#                                      [--flags "--batch 16 --accumulate 2" --suffix acc2] [--out DIR]
# --flags adds trainer flags to every run and --suffix names those runs' composition <name>_<suffix>
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
logs="$(mktemp -d)"
runs_csv="$out/runs.csv"
add_run() {  # add_run NAME SEED CSV: the run's rows into runs.csv as NAME,SEED,<row>, replacing an earlier NAME SEED
  local n="$1" s="$2" f="$3" header
  header="composition,seed,$(head -n 1 "$f")"
  if [[ -f "$runs_csv" ]]; then
    [[ "$(head -n 1 "$runs_csv")" == "$header" ]] || { echo "convergence.sh: $f's columns differ from $runs_csv's" >&2; exit 1; }
    grep -v "^$n,$s," "$runs_csv" > "$runs_csv.tmp" || true
  else
    echo "$header" > "$runs_csv.tmp"
  fi
  tail -n +2 "$f" | sed "s/^/$n,$s,/" >> "$runs_csv.tmp"
  mv "$runs_csv.tmp" "$runs_csv"
}
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
    mpiexec "${mpi_flags[@]}" -n 4 "$build/examples/$r" --epochs "$epochs" --seed "$s" "${flag_list[@]}" --csv "$logs/${n}_s$s.csv" >"$logs/${n}_s$s.log"
    grep RESULT "$logs/${n}_s$s.log" >&2
    add_run "$n" "$s" "$logs/${n}_s$s.csv"
  done
done
echo "convergence: done in $((SECONDS - start)) s; the runs' logs are in $logs" >&2
if [[ "$out" == "$root/docs/results/torch" ]]; then
  python3 "$root/examples/torch/convergence_table.py" "$out" -o "$root/docs/convergence_torch.png"
else
  python3 "$root/examples/torch/convergence_table.py" "$out" -o "$out/convergence.png"
fi
