#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, build the Fashion-MNIST trainer (one
# binary per policy composition) and train it with 4 MPI ranks over a handful of compositions,
# then print a table: test accuracy, iteration time, bytes sent per rank per iteration.
# About five minutes on 2 cores, build included.
#
#   bash scripts/demo.sh                 # 2 epochs: dense fp32, fp16 wire, CSC, TopK, elastic averaging
#   bash scripts/demo.sh --epochs 5      # longer
#   bash scripts/demo.sh --full          # every composition of the convergence study, 10 epochs
#   bash scripts/demo.sh --torch         # the libtorch CNN (examples/torch) instead of the MLP, 3 epochs
#   bash scripts/demo.sh --python        # the same CNN in plain PyTorch + gflow.torch (examples/python/train.py), 3 epochs
#   bash scripts/demo.sh --python --device cuda   # that on the GPU (2 ranks; says so and trains nothing where there is none)
#   bash scripts/demo.sh --bench [...]   # the exchange benchmark instead (bench/run exchange, ResNet-50)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
epochs=2
full=0
torch=0
python=0
device=cpu
while (($#)); do
  case "$1" in
    --bench) shift; bash "$root/scripts/install-deps.sh"; exec "$root/bench/run" exchange --layout resnet50 --ranks 4 --quick "$@" ;;
    --full) full=1; epochs=10; shift ;;
    --torch) torch=1; epochs=3; shift ;;
    --python) python=1; epochs=3; shift ;;
    --epochs) epochs="${2:-}"; shift 2 ;;
    --device) device="${2:-}"; shift 2 ;;
    *) echo "demo.sh: unknown option '$1' (use --epochs N, --full, --torch, --python [--device cuda] or --bench)" >&2; exit 2 ;;
  esac
done
if ! [[ "$epochs" =~ ^[1-9][0-9]*$ ]]; then echo "demo.sh: --epochs needs a positive integer, got '$epochs'" >&2; exit 2; fi
if [[ "$device" != cpu && "$device" != cuda ]]; then echo "demo.sh: --device takes cpu or cuda, got '$device'" >&2; exit 2; fi
if [[ "$device" == cuda && "$python" == 0 ]]; then echo "demo.sh: --device cuda goes with --python (the C++ trainers run on the CPU)" >&2; exit 2; fi

bash "$root/scripts/install-deps.sh"
build="${GFLOW_DEMO_BUILD:-$root/build-demo}"
runs=(train_dense train_fp16 train_csc train_topk train_oktopk train_easgd)
if ((full)); then
  runs=(train_dense train_fp16 train_bf16 train_csc train_topk train_gtopk train_oktopk train_hier train_funneled train_concurrent train_chained train_easgd)
fi
if ((torch)); then
  runs=(torch_dense torch_fp16 torch_csc torch_topk torch_oktopk torch_funneled)
  ((full)) && runs=(torch_dense torch_fp16 torch_csc torch_topk torch_gtopk torch_oktopk torch_funneled)
fi
if ((python)); then
  # gflow.torch: the module (one build of the menu), then train.py over a few compositions.
  comps=(dense fp16 csc=4096:15 topk=0.01 "fp16+fusion=4MiB+topk=0.01+funneled")
  echo "demo: building the Python module gflow.torch in $build" >&2
  cuda=OFF targets=(gflow_python)
  if [[ "$device" == cuda ]]; then cuda=ON targets+=(gflow_python_cuda); fi
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGFLOW_ENABLE_CUDA=$cuda -DGFLOW_BUILD_TESTS=OFF -DGFLOW_BUILD_BENCH=OFF >/dev/null
  if [[ "$device" == cuda && "$(cmake --build "$build" --target help)" != *gflow_python_cuda* ]]; then
    echo "demo: --device cuda needs nvcc and NCCL (CUDA toolkit in /usr/local/cuda); this machine has no CUDA build of gflow.torch: nothing trained." >&2
    exit 0
  fi
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null
  export OMPI_MCA_rmaps_base_oversubscribe=1 PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
  mpi_flags=(--bind-to none)
  if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
  if [[ "$device" == cuda ]]; then
    # One epoch per composition on the GPU, 2 ranks (each on the node-local GPU; two ranks on one GPU
    # exchange through the device MPI transport). train.py says why and exits 77 where there is no GPU.
    # GFLOW_PYTHON: the interpreter with a CUDA torch (default: python3 on PATH).
    for c in dense "fp16+fusion=4MiB+topk=0.01+funneled"; do
      echo "demo: python train.py --device cuda --composition $c, 2 ranks, $epochs epochs" >&2
      rc=0
      mpiexec "${mpi_flags[@]}" -n 2 "${GFLOW_PYTHON:-python3}" "$root/examples/python/train.py" --device cuda --composition "$c" --epochs "$epochs" \
        | tee "$build/demo_cuda_${c//[^a-z0-9]/_}.log" >&2 || rc=$?
      if ((rc == 77)); then echo "demo: no GPU on this machine: nothing trained on CUDA (see the line above)." >&2; exit 0; fi
      ((rc == 0)) || exit "$rc"
    done
    echo >&2
    grep -h '^RESULT ' "$build"/demo_cuda_*.log
    exit 0
  fi
  for c in "${comps[@]}"; do
    echo "demo: python train.py --composition $c, 4 ranks, $epochs epochs" >&2
    mpiexec "${mpi_flags[@]}" -n 4 /usr/bin/python3 "$root/examples/python/train.py" --composition "$c" --epochs "$epochs" | tee "$build/demo_python_${c//[^a-z0-9]/_}.log" >&2
  done
  echo >&2
  grep -h '^RESULT ' "$build"/demo_python_*.log
  exit 0
fi
echo "demo: building ${runs[*]} in $build" >&2
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_BUILD_TESTS=OFF -DGFLOW_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${runs[@]}" >/dev/null

export OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
results=()
for r in "${runs[@]}"; do
  echo "demo: $r, 4 ranks, $epochs epochs" >&2
  # progress on stderr; tee to a file (not /dev/stderr, which truncates a redirected log)
  mpiexec "${mpi_flags[@]}" -n 4 "$build/examples/$r" --epochs "$epochs" | tee "$build/demo_$r.log" >&2
  results+=("$(grep '^RESULT ' "$build/demo_$r.log")")
done

# The table: one row per composition, bytes relative to dense fp32.
printf '%s\n' "${results[@]}" | awk '
  function get(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
  BEGIN {
    desc["train_dense"] = "dense fp32 (ring allreduce)"; desc["train_fp16"] = "fp16 wire + dynamic loss scale"
    desc["train_bf16"] = "bf16 wire + dynamic loss scale"; desc["train_csc"] = "CSC 15% of 4096-elem chunks"
    desc["train_topk"] = "TopK density 0.01"; desc["train_gtopk"] = "GTopK density 0.01"
    desc["train_oktopk"] = "OkTopK density 0.01"; desc["torch_oktopk"] = "CNN OkTopK density 0.01"
    desc["train_hier"] = "Hierarchical<2>"; desc["train_funneled"] = "Overlap<Funneled>"
    desc["train_concurrent"] = "Overlap<Concurrent<2>>"; desc["train_chained"] = "Overlap<Chained>"
    desc["train_easgd"] = "sync elastic averaging (weights)"
    desc["torch_dense"] = "CNN dense fp32"; desc["torch_fp16"] = "CNN fp16 wire + dynamic loss scale"
    desc["torch_csc"] = "CNN CSC 15% of 4096-elem chunks"; desc["torch_topk"] = "CNN TopK density 0.01"
    desc["torch_gtopk"] = "CNN GTopK density 0.01"; desc["torch_funneled"] = "CNN Overlap<Funneled>"
    printf "\n%-34s %9s %11s %16s %9s\n", "composition (4 ranks)", "test acc", "ms / iter", "KiB / iter / rank", "vs dense"
    printf "%-34s %9s %11s %16s %9s\n", "----------------------------------", "--------", "---------", "----------------", "--------"
  }
  {
    n = get("name"); b = get("bytes_per_iter"); if (n == "train_dense" || n == "torch_dense") dense = b
    d = (n in desc) ? desc[n] : n
    rel = (dense > 0) ? sprintf("%.3fx", b / dense) : "-"
    printf "%-34s %8.2f%% %11.2f %16.1f %9s\n", d, get("test_acc"), get("ms_per_iter"), b / 1024, rel
  }
  END { printf "\nbytes: what each rank hands to collectives per iteration after warm-up (last epoch); ms: training only, no evaluation.\n" }'
