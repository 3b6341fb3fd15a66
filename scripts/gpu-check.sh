#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT_DIR]: everything a machine with a GPU should verify, in one command.
# Needs only the repository and the CUDA toolkit (nvcc, NCCL, CCCL): no network.
#   1. builds the CUDA targets (Release, build-gpu/): gflow_cuda_tests, gflow_cuda_mpi_tests, the
#      NCCL compile check, gflow_bench_device, gflow_bench_exchange_device (each by name: without
#      NCCL the build fails, it is not skipped);
#   2. runs every CUDA test suite (gflow_cuda_tests kernels | device | nccl, what ctest's cuda_*
#      tests run): kernels vs host, the device-vs-host bitwise exchanges for P = 1..4, NCCL
#      collectives and exchanger;
#   3. runs the device suite again in two processes at once (the in-process device transport with
#      another process on the GPU), then gflow_cuda_mpi_tests under mpiexec at 1, 2 and 4 processes
#      on the one GPU (gflow::mpi_device::transport bitwise against the host MPI transport and the
#      in-process one);
#   4. runs bench/run kernels --device: casts, norms, residual and compaction kernels in GB/s
#      against a copy kernel of the same run, top-k of 25.6 M fp32 at d = 0.001 / 0.01 (and
#      torch.topk when Python's torch imports);
#   5. runs gflow_bench_exchange_device (resnet50, d = 0.001, GTopK / TopK / OkTopK) at 1 and 4
#      ranks in one process (inproc_device) and at 4 processes under mpiexec (mpi_device);
#   6. runs gflow.torch on CUDA tensors: tests/python/test_gflow_torch_cuda.py (pytest -m cuda) under
#      mpiexec at 1, 2 and 4 processes on the one GPU, against the C++ reference's files, and one
#      epoch of examples/python/train.py --device cuda at 2 ranks (--check-acc 65), with the
#      machine's Python (GFLOW_PYTHON, default python3: it must import torch with CUDA), then
#      bench/ddp_gloo.py --device cuda --gflow fusion=4MiB (resnet50) at 1, 2 and 4 processes:
#      gflow.torch's exchange against DDP over gloo and against the same calls in C++;
#   7. prints every target MET / MISSED (bench/device_targets.py).
# GFLOW_GPU_STEPS picks steps 2-6 (default all: "tests mpi kernels exchange python"), e.g.
# GFLOW_GPU_STEPS=python for gflow.torch alone, so that each call fits the device tool's 10 minutes.
# GFLOW_GPU_PREBUILT=DIR skips step 1 (without it the script builds: about 400 s of a lease on
# an H200's 16 cores): DIR holds the binaries built elsewhere for this GPU, as
# scripts/gpu-bundle.sh lays them out (DIR/lib: shared libraries, linked in only where the machine
# lacks them; DIR/mpi: an Open MPI runtime, used when the machine has no mpiexec of its own (the
# lent H200 machines had Open MPI 4.1); DIR/COMMIT: the commit they were built at, as a copied
# tree's .git may be stale).
# The flow a session with a lent GPU follows, from the repository root:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGFLOW_CUDA_ARCHITECTURES=90
#   cmake --build build -j2 --target gflow_cuda_tests gflow_cuda_mpi_tests gflow_bench_device gflow_bench_exchange_device \
#                                    gflow_python_cuda gflow_python_reference
#                                           (about 25 minutes on 2 cores)
#   bash scripts/gpu-bundle.sh build        (.gpu/, about 30 MB, ignored by git)
#   then, through the device tool with carry [".gpu"]:  GFLOW_GPU_PREBUILT=$PWD/.gpu bash scripts/gpu-check.sh
#   (OUT_DIR defaults to $OUT there, so the results come back).
# Results go to OUT_DIR (default: $OUT when set, else results/gpu-check-<UTC time>): build.log,
# tests.log, mpi.log, kernels_device.jsonl (one JSON object per kernel), kernels_device.txt (the
# table), exchange_device.jsonl / .txt, python_cuda.log, python_cuda_bench.jsonl, summary.txt. Exit status: 0 when every step passed, else 1
# (a missed speed target is reported, not a failure). Time on an H200 (2026-11-28): the build 395 s,
# the three CUDA suites 20 s, the kernel benchmark with torch.topk about 15 s; the whole script with
# prebuilt binaries has not been timed in one piece yet.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${OUT:-$root/results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}}"
mkdir -p "$out"
build="${GFLOW_GPU_BUILD:-$root/build-gpu}"
jobs="$(nproc)"
summary="$out/summary.txt"
: > "$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
steps=" ${GFLOW_GPU_STEPS:-tests mpi kernels exchange python} "
want() { [[ "$steps" == *" $1 "* ]]; }
step_start() { t0=$(date +%s); echo "== $1" >&2; }
step_end() { note "$1: $2 ($(( $(date +%s) - t0 )) s)"; }

note "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
else
  note "device: nvidia-smi not found"
fi
note "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"

# Build for this GPU only (compute capability from nvidia-smi, e.g. 9.0 -> 90): half the device
# compile time of the default "80;90".
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
archs=()
if [[ "$arch" =~ ^[0-9]+$ ]]; then archs=(-DGFLOW_CUDA_ARCHITECTURES="$arch"); fi
if [[ -n "${GFLOW_GPU_PREBUILT:-}" ]]; then
  tests_bin="$GFLOW_GPU_PREBUILT/gflow_cuda_tests"
  mpi_bin="$GFLOW_GPU_PREBUILT/gflow_cuda_mpi_tests"
  bench_dir="$GFLOW_GPU_PREBUILT"
  if ! command -v mpiexec >/dev/null && [[ -d "$GFLOW_GPU_PREBUILT/mpi/usr" ]]; then
    export OPAL_PREFIX="$GFLOW_GPU_PREBUILT/mpi/usr" PMIX_INSTALL_PREFIX="$GFLOW_GPU_PREBUILT/mpi/usr/lib/x86_64-linux-gnu/pmix2"
    export PATH="$OPAL_PREFIX/bin:$PATH"
    note "mpi: the bundle's Open MPI runtime (OPAL_PREFIX=$OPAL_PREFIX)"
  fi
  # Only the libraries a binary cannot find are taken from elsewhere, each linked into a folder of
  # its own: LD_LIBRARY_PATH goes before the machine's own libraries, so a whole folder of the
  # bundle's (an older PMIx, say) would shadow the machine's MPI runtime.
  libdir="$(mktemp -d /tmp/gflow-gpu-libs.XXXXXX)"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  py_pkg="$GFLOW_GPU_PREBUILT/python"
  py_ref="$GFLOW_GPU_PREBUILT/python/gflow_python_reference"
  for bin in "$tests_bin" "$mpi_bin" "$bench_dir/bench/gflow_bench_device" "$bench_dir/bench/gflow_bench_exchange_device" \
             "$py_pkg/gflow/libgflow_capi_cuda.so" "$py_ref"; do
    [[ -f "$bin" ]] || continue
    for lib in $(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}'); do
      found="$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /usr/local/cuda/targets/ /usr/lib/ /opt/ /usr/local/lib/ \
                    "$GFLOW_GPU_PREBUILT/lib/" -name "$lib" 2>/dev/null | head -1)"
      if [[ -n "$found" ]]; then
        ln -sf "$found" "$libdir/$lib"
        note "library: $lib from $found"
      else
        note "library: $lib NOT FOUND"
      fi
    done
  done
else
  tests_bin="$build/tests/cuda/gflow_cuda_tests"
  mpi_bin="$build/tests/cuda/gflow_cuda_mpi_tests"
  bench_dir="$build"
  py_pkg="$build/python"
  py_ref="$build/tests/python/gflow_python_reference"
  step_start "build"
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGFLOW_BUILD_EXAMPLES=OFF "${archs[@]}" > "$out/build.log" 2>&1 &&
     grep -q "CUDA ON" "$out/build.log" &&
     cmake --build "$build" -j"$jobs" --target gflow_cuda_tests gflow_cuda_mpi_tests gflow_bench_device gflow_bench_exchange_device gflow_nccl_sparse_compile \
       gflow_python_cuda gflow_python_reference >> "$out/build.log" 2>&1; then
    step_end "build" "ok"
  else
    step_end "build" "FAILED (see build.log)"
    tail -30 "$out/build.log" >&2
    exit 1
  fi
fi

if want tests; then
step_start "CUDA tests"
: > "$out/tests.log"
limit="${GFLOW_GPU_TEST_TIMEOUT:-300}"  # seconds per suite: a hung collective is the usual failure
for suite in kernels device nccl; do
  s0=$(date +%s)
  timeout "$limit" "$tests_bin" "$suite" >> "$out/tests.log" 2>&1
  rc=$?
  took="$(( $(date +%s) - s0 )) s"
  last="$(grep -E '^[0-9]+ test\(s\)' "$out/tests.log" | tail -1)"
  if [[ $rc == 0 ]]; then
    note "  $suite: ok, $last ($took)"
  elif [[ $rc == 77 ]]; then
    # A skipped CUDA test saw no GPU: on the machine this script is for, that is a failure.
    note "  $suite: SKIPPED: the tests saw no CUDA device (see tests.log)"; status=1
  elif [[ $rc == 124 ]]; then
    note "  $suite: TIMED OUT after $limit s (see tests.log)"; status=1
  else
    note "  $suite: FAILED, exit $rc, $last ($took; see tests.log)"; status=1
  fi
done
grep -E '^\[ FAIL \]|FAILED' "$out/tests.log" | head -30 | tee -a "$summary" >&2
step_end "CUDA tests" "$([[ $status == 0 ]] && echo ok || echo 'with failures')"

step_start "device suite, two processes at once"
# inproc_device with another process on the GPU (seen on 2026-11-28: other bytes than the host's
# in a process that shared the GPU; this tells whether the device suite alone shows it).
tmpa="$(mktemp)"; tmpb="$(mktemp)"
timeout "$limit" "$tests_bin" device > "$tmpa" 2>&1 & pa=$!
timeout "$limit" "$tests_bin" device > "$tmpb" 2>&1; rb=$?
wait "$pa"; ra=$?
{ echo "== device suite, process A of two"; cat "$tmpa"; echo "== device suite, process B of two"; cat "$tmpb"; } >> "$out/tests.log"
for x in "A $ra $tmpa" "B $rb $tmpb"; do
  read -r who rc f <<< "$x"
  last="$(grep -E '^[0-9]+ test\(s\)' "$f" | tail -1)"
  if [[ $rc == 0 ]]; then note "  device, process $who of two: ok, $last"; else note "  device, process $who of two: FAILED, exit $rc, $last"; status=1; fi
done
rm -f "$tmpa" "$tmpb"
step_end "device suite, two processes at once" "done"
fi

# Open MPI inside a container: no single-copy (CMA) between the ranks, the ob1 PML over shared
# memory and TCP (no UCX), no warnings about unused network components.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_base_warn_component_unused=0
mpirun_=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
: > "$out/mpi.log"
mpi_ok=0
want mpi && step_start "CUDA tests under mpiexec"
if ! command -v mpiexec >/dev/null; then
  note "  mpiexec: not found (no MPI here and no bundle): the mpi_device checks did NOT run"; status=1
elif ! timeout 60 "${mpirun_[@]}" -n 2 true >> "$out/mpi.log" 2>&1; then
  note "  mpiexec: cannot start 2 processes here (see mpi.log): the mpi_device checks did NOT run"; status=1
elif [[ ! -x "$mpi_bin" ]]; then
  note "  gflow_cuda_mpi_tests: not built: the mpi_device checks did NOT run"; status=1
elif ! want mpi; then
  mpi_ok=1
else
  mpi_ok=1
  for np in 1 2 4; do
    s0=$(date +%s)
    echo "== mpiexec -n $np" >> "$out/mpi.log"
    timeout "$limit" "${mpirun_[@]}" -n "$np" "$mpi_bin" mpi_device >> "$out/mpi.log" 2>&1
    rc=$?
    took="$(( $(date +%s) - s0 )) s"
    last="$(grep -E '^[0-9]+ test\(s\)' "$out/mpi.log" | tail -1)"
    case $rc in
      0) note "  mpi_device, $np process(es): ok, $last ($took)" ;;
      77) note "  mpi_device, $np process(es): SKIPPED: no CUDA device seen (see mpi.log)"; status=1 ;;
      124) note "  mpi_device, $np process(es): TIMED OUT after $limit s (see mpi.log)"; status=1 ;;
      *) note "  mpi_device, $np process(es): FAILED, exit $rc, $last ($took; see mpi.log)"; status=1 ;;
    esac
  done
  grep -E 'FAILED|reported, not required' "$out/mpi.log" | sort | uniq | head -30 | tee -a "$summary" >&2
fi
want mpi && step_end "CUDA tests under mpiexec" "$([[ $status == 0 ]] && echo ok || echo 'with failures')"

if want kernels; then
step_start "bench kernels --device"
if GFLOW_BENCH_DEVICE_BUILD="$bench_dir" GFLOW_BENCH_PREBUILT="${GFLOW_GPU_PREBUILT:+1}" "$root/bench/run" kernels --device > "$out/kernels_device.jsonl" 2> "$out/kernels_device.txt"; then
  step_end "bench kernels --device" "ok"
else
  step_end "bench kernels --device" "FAILED (see kernels_device.txt)"
  status=1
fi
cat "$out/kernels_device.txt" | tee -a "$summary"
fi

if want exchange; then
step_start "bench exchange_device"
exbin="$bench_dir/bench/gflow_bench_exchange_device"
: > "$out/exchange_device.jsonl"
: > "$out/exchange_device.txt"
runs=("inproc 1" "inproc 4")
[[ $mpi_ok == 1 ]] && runs+=("mpi 4")
for run in "${runs[@]}"; do
  read -r via np <<< "$run"
  if [[ $via == mpi ]]; then cmd=("${mpirun_[@]}" -n "$np" "$exbin" --transport mpi --iters 30)
  else cmd=("$exbin" --ranks "$np" --iters 30); fi
  if timeout "$limit" "${cmd[@]}" >> "$out/exchange_device.jsonl" 2>> "$out/exchange_device.txt"; then
    note "  exchange_device $via $np: ok"
  else
    note "  exchange_device $via $np: FAILED (see exchange_device.txt)"; status=1
  fi
done
grep -vE '^  [0-9]+ of [0-9]+ rounds' "$out/exchange_device.txt" | tee -a "$summary"
step_end "bench exchange_device" "done"
fi

if want python; then
step_start "gflow.torch on CUDA"
py="${GFLOW_PYTHON:-python3}"
: > "$out/python_cuda.log"
pyenv_=(env PYTHONPATH="$py_pkg${GFLOW_GPU_PREBUILT:+:$py_pkg/site}" OMPI_MCA_rmaps_base_oversubscribe=1)
if [[ $mpi_ok != 1 ]]; then
  note "  gflow.torch: not run (no mpiexec, see above)"; status=1
elif ! "${pyenv_[@]}" "$py" -c 'import torch, numpy, pytest, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >> "$out/python_cuda.log" 2>&1; then
  note "  gflow.torch: not run: $py cannot import torch (with CUDA), numpy and pytest (see python_cuda.log)"; status=1
else
  refdir="$out/python_reference"; mkdir -p "$refdir"
  for np in 1 2 4; do
    s0=$(date +%s)
    echo "== reference and pytest -m cuda, $np process(es)" >> "$out/python_cuda.log"
    timeout 120 "${mpirun_[@]}" -n "$np" "$py_ref" "$refdir" >> "$out/python_cuda.log" 2>&1 &&
      timeout "$limit" "${mpirun_[@]}" -n "$np" "${pyenv_[@]}" GFLOW_REFERENCE_DIR="$refdir" GFLOW_SKIPPED_EXIT=77 "$py" -m pytest -q -x -rs --color=no \
        -p no:cacheprovider -m cuda "$root/tests/python/test_gflow_torch_cuda.py" >> "$out/python_cuda.log" 2>&1
    rc=$?
    case $rc in
      0) note "  gflow.torch pytest -m cuda, $np process(es): ok ($(( $(date +%s) - s0 )) s)" ;;
      77) note "  gflow.torch pytest -m cuda, $np process(es): SKIPPED: no GPU seen (see python_cuda.log)"; status=1 ;;
      *) note "  gflow.torch pytest -m cuda, $np process(es): FAILED, exit $rc (see python_cuda.log)"; status=1 ;;
    esac
  done
  data=/usr/share/datasets/fashion-mnist
  [[ -n "${GFLOW_GPU_PREBUILT:-}" && -d "$GFLOW_GPU_PREBUILT/python/data" ]] && data="$GFLOW_GPU_PREBUILT/python/data"
  for c in dense "fp16+fusion=4MiB+topk=0.01+funneled"; do
    echo "== train.py --device cuda --composition $c" >> "$out/python_cuda.log"
    timeout "$limit" "${mpirun_[@]}" -n 2 "${pyenv_[@]}" "$py" "$root/examples/python/train.py" --device cuda --data "$data" --epochs 1 \
      --train-limit 6400 --check-acc 65 --composition "$c" --warmup-iters 20 >> "$out/python_cuda.log" 2>&1
    rc=$?
    res="$(grep '^RESULT ' "$out/python_cuda.log" | tail -1)"
    if [[ $rc == 0 ]]; then note "  train.py --device cuda $c: ok: $res"; else note "  train.py --device cuda $c: FAILED, exit $rc: $res"; status=1; fi
  done
  # Speed (issue targets: gflow_backward at most 0.6x ddp_backward at 2 and 4 ranks on one GPU;
  # gflow_python within 5% of gflow_cpp; gflow_backward at most 1.03x local_backward at 1 rank).
  : > "$out/python_cuda_bench.jsonl"
  for np in 1 2 4; do
    echo "== bench/ddp_gloo.py --device cuda, $np process(es)" >> "$out/python_cuda.log"
    if timeout "$limit" "${mpirun_[@]}" -n "$np" "${pyenv_[@]}" "$py" "$root/bench/ddp_gloo.py" --device cuda --layout resnet50 --gflow fusion=4MiB \
         --iters 8 --warmup 2 >> "$out/python_cuda_bench.jsonl" 2>> "$out/python_cuda.log"; then
      note "  gflow.torch speed, $np process(es): $(grep '^gflow_backward / ddp_backward' "$out/python_cuda.log" | tail -1)"
    else
      note "  gflow.torch speed, $np process(es): FAILED (see python_cuda.log)"; status=1
    fi
  done
  grep -E 'FAILED|Error|SKIPPED' "$out/python_cuda.log" | sort | uniq | head -20 | tee -a "$summary" >&2
fi
step_end "gflow.torch on CUDA" "done"
fi

if [[ -s "$out/kernels_device.jsonl" && -s "$out/exchange_device.jsonl" ]]; then
  python3 "$root/bench/device_targets.py" "$out/kernels_device.jsonl" "$out/exchange_device.jsonl" 2>&1 | tee -a "$summary"
fi
note "results in $out"
exit "$status"
