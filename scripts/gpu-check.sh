#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT_DIR]: everything a machine with a GPU should verify, in one command
# (issue 12). Needs only the repository and the CUDA toolkit (nvcc, NCCL, CCCL): no network.
#   1. builds the CUDA targets (Release, build-gpu/): gflow_cuda_tests, the NCCL compile check,
#      gflow_bench_device (each by name: without NCCL the build fails, it is not skipped);
#   2. runs every CUDA test suite (gflow_cuda_tests kernels | device | nccl, what ctest's cuda_*
#      tests run): kernels vs host, the device-vs-host bitwise exchanges for P = 1..4, NCCL
#      collectives and exchanger;
#   3. runs bench/run kernels --device: casts, norms, residual and compaction kernels in GB/s
#      against a copy kernel of the same run, top-k of 25.6 M fp32 at d = 0.001 / 0.01 (and
#      torch.topk when Python's torch imports).
# GFLOW_GPU_PREBUILT=DIR skips step 1: DIR holds gflow_cuda_tests and gflow_bench_device built
# elsewhere for this GPU (a machine whose image lacks {fmt} or doctest, or a short lease: the
# build is most of the budget). Shared libraries the binaries cannot find (libnccl.so.2,
# libcudart.so.13) are looked up in the CUDA toolkit, Python's nvidia-* packages and DIR/lib;
# DIR/COMMIT, if present, names the commit they were built at (a copied tree's .git may be stale).
# What a session with a lent GPU ran (docs/BENCHMARKS.md section 5), from the repository root:
#   cmake --build build --target gflow_cuda_tests gflow_bench_device gflow_bench_exchange_device
#   mkdir -p .gpu/bench .gpu/lib && cp build/tests/cuda/gflow_cuda_tests .gpu/ &&
#   cp build/bench/gflow_bench_device build/bench/gflow_bench_exchange_device .gpu/bench/ &&
#   cp -L /usr/local/lib/libcudart.so.13 .gpu/lib/ && git rev-parse --short HEAD > .gpu/COMMIT
#   (there, with .gpu carried)  GFLOW_GPU_PREBUILT=$PWD/.gpu bash scripts/gpu-check.sh
# Results go to OUT_DIR (default: $OUT when set, else results/gpu-check-<UTC time>): build.log,
# tests.log, kernels_device.jsonl (one JSON object per kernel), kernels_device.txt (the table),
# summary.txt. Exit status: 0 when every step passed, else 1. Budget: 8 minutes on an H100 with
# the build (-j is the machine's core count), about 2 without.
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
  bench_dir="$GFLOW_GPU_PREBUILT"
  note "build: skipped, prebuilt binaries from $GFLOW_GPU_PREBUILT$( [[ -f "$GFLOW_GPU_PREBUILT/COMMIT" ]] && echo ", built at $(cat "$GFLOW_GPU_PREBUILT/COMMIT")")"
  # Put the directory of every library a binary cannot find on LD_LIBRARY_PATH.
  for bin in "$tests_bin" "$bench_dir/bench/gflow_bench_device"; do
    for lib in $(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}'); do
      found="$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /usr/local/cuda/targets/ /usr/lib/ /opt/ /usr/local/lib/ \
                    "$GFLOW_GPU_PREBUILT/lib/" -name "$lib" 2>/dev/null | head -1)"
      if [[ -n "$found" ]]; then
        export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        note "library: $lib from $found"
      else
        note "library: $lib NOT FOUND"
      fi
    done
  done
else
  tests_bin="$build/tests/cuda/gflow_cuda_tests"
  bench_dir="$build"
  step_start "build"
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGFLOW_BUILD_EXAMPLES=OFF "${archs[@]}" > "$out/build.log" 2>&1 &&
     grep -q "CUDA ON" "$out/build.log" &&
     cmake --build "$build" -j"$jobs" --target gflow_cuda_tests gflow_bench_device gflow_nccl_sparse_compile >> "$out/build.log" 2>&1; then
    step_end "build" "ok"
  else
    step_end "build" "FAILED (see build.log)"
    tail -30 "$out/build.log" >&2
    exit 1
  fi
fi

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

step_start "bench kernels --device"
if GFLOW_BENCH_DEVICE_BUILD="$bench_dir" GFLOW_BENCH_PREBUILT="${GFLOW_GPU_PREBUILT:+1}" "$root/bench/run" kernels --device > "$out/kernels_device.jsonl" 2> "$out/kernels_device.txt"; then
  step_end "bench kernels --device" "ok"
else
  step_end "bench kernels --device" "FAILED (see kernels_device.txt)"
  status=1
fi
cat "$out/kernels_device.txt" | tee -a "$summary"
python3 "$root/bench/device_targets.py" "$out/kernels_device.jsonl" 2>&1 | tee -a "$summary"
note "results in $out"
exit "$status"
