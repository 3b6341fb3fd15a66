#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT_DIR]: everything a machine with a GPU should verify, in one command
# (issue 12). Needs only the repository and the CUDA toolkit (nvcc, NCCL, CCCL): no network.
#   1. builds the CUDA targets (Release, build-gpu/): gflow_cuda_tests, the NCCL compile check,
#      gflow_bench_device (each by name: without NCCL the build fails, it is not skipped);
#   2. runs every CUDA test (ctest -R '^cuda_'): kernels vs host, NCCL collectives and exchanger,
#      the device-vs-host bitwise exchanges for P = 1..4 (suite "device");
#   3. runs bench/run kernels --device: casts, norms, residual and compaction kernels in GB/s
#      against a copy kernel of the same run, top-k of 25.6 M fp32 at d = 0.001 / 0.01 (and
#      torch.topk when Python's torch imports).
# Results go to OUT_DIR (default: $OUT when set, else results/gpu-check-<UTC time>): build.log,
# ctest.log, kernels_device.jsonl (one JSON object per kernel), kernels_device.txt (the table),
# summary.txt. Exit status: 0 when every step passed, else the first failure's. Budget: 8 minutes
# on an H100 (the build is most of it; -j is the machine's core count).
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

step_start "CUDA tests"
if ctest --test-dir "$build" -R '^cuda_' --output-on-failure --no-tests=error --timeout 300 > "$out/ctest.log" 2>&1; then
  if grep -q "Skipped" "$out/ctest.log"; then
    # A skipped CUDA test saw no GPU: on the machine this script is for, that is a failure.
    step_end "CUDA tests" "SKIPPED: the tests saw no CUDA device (see ctest.log)"
    status=1
  else
    step_end "CUDA tests" "ok, $(grep -Eo '[0-9]+% tests passed.*' "$out/ctest.log" | tail -1)"
  fi
else
  step_end "CUDA tests" "FAILED (see ctest.log)"
  grep -E "FAILED" "$out/ctest.log" | head -20 | tee -a "$summary" >&2
  status=1
fi
grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+: cuda_" "$out/ctest.log" | sed 's/^ */  /' | tee -a "$summary"

step_start "bench kernels --device"
if GFLOW_BENCH_DEVICE_BUILD="$build" "$root/bench/run" kernels --device > "$out/kernels_device.jsonl" 2> "$out/kernels_device.txt"; then
  step_end "bench kernels --device" "ok"
else
  step_end "bench kernels --device" "FAILED (see kernels_device.txt)"
  status=1
fi
cat "$out/kernels_device.txt" | tee -a "$summary"
python3 "$root/bench/device_targets.py" "$out/kernels_device.jsonl" 2>&1 | tee -a "$summary"
note "results in $out"
exit "$status"
