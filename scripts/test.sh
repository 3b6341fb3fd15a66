#!/usr/bin/env bash
# Every test on a fresh machine: install what is needed, then
#   1. a Release build of everything (CUDA targets compile when nvcc is present; they run only
#      where a GPU is, and report "skipped" elsewhere) and the whole ctest suite, the libtorch CNN
#      trainer's short trainings included (torch_*; "skipped" where libtorch-dev is missing), but
#      the host unit suite (gflow_tests, ctest 'unit'), which stage 2 builds and runs;
#   2. the host unit suite and the MPI tests under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the libFuzzer targets (Clang): their kept corpora, then a short fuzz run of each;
#   4. the threaded parts (in-process transport, exchanger on thread ranks) under ThreadSanitizer.
# Every ctest call passes --no-tests=error: a stage whose filter matches no test fails, never passes
# with nothing run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
jobs="$(nproc)"
out="${GFLOW_TEST_BUILD:-$root/build-test}"
export OMPI_MCA_rmaps_base_oversubscribe=1

step() { printf '\n==== %s ====\n' "$*"; }
# What did not run, said after the full ctest run: the ctest tests reported skipped (exit 77: no
# GPU, no libtorch; from ctest's own list in its output) and the doctest cases that skipped
# themselves inside a passing binary (doctest::skip: no AVX2 + F16C, no dataset; from the
# "[doctest] test cases: ... | N skipped" summaries in the run's log).
report_skipped() {  # report_skipped BUILD_DIR CTEST_OUTPUT
  local listed doctest_skipped
  listed=$(sed -n '/^The following tests did not run:/,/^[^[:space:]]/p' "$2" | grep -E '^[[:space:]]+[0-9]+ - ' || true)
  doctest_skipped=$(grep -hoE '\| +[0-9]+ skipped' "$1/Testing/Temporary/LastTest.log" 2>/dev/null | awk '{s += $2} END {print s + 0}')
  printf 'skipped: %d ctest test(s), %d doctest case(s) inside passing tests\n' "$(printf '%s' "$listed" | grep -c . || true)" "$doctest_skipped"
  [[ -z "$listed" ]] || printf '%s\n' "$listed"
}

step "release build + full test suite"
# One CUDA architecture is enough to check that the CUDA code compiles (no GPU here; scripts/gpu-check.sh
# builds for the GPU it runs on). No CUDA binary runs here, so their host code is compiled at -O0:
# nvcc hands the host half of a .cu file to g++, which takes about 3/4 of its time at -O3 and half
# as long at -O0 (tests/cuda/test_device_sparse.cu: 137 s against 67); the device code is optimised
# as always (cicc and ptxas do not read -O). scripts/gpu-check.sh's builds keep -O3.
# GFLOW_REQUIRE_TESTS: a package missing here fails the configure instead of leaving its tests out.
# GFLOW_BUILD_UNIT_TESTS=OFF: the host unit suite is compiled and run once, in the sanitizer stage
# (the same test cases; compiling them at -O3 too took about 8 of this run's minutes).
cmake -S "$root" -B "$out/release" -DCMAKE_BUILD_TYPE=Release -DGFLOW_CUDA_ARCHITECTURES=90 -DGFLOW_REQUIRE_TESTS=ON \
  -DGFLOW_BUILD_UNIT_TESTS=OFF -DCMAKE_CUDA_FLAGS_RELEASE="-O0 -DNDEBUG" >/dev/null
cmake --build "$out/release" -j"$jobs"
ctest --test-dir "$out/release" --output-on-failure --no-tests=error -j"$jobs" | tee "$out/release/ctest.out"
report_skipped "$out/release" "$out/release/ctest.out"
echo "not built here: the host unit suite (gflow_tests, ctest 'unit'); the next stage builds and runs it under ASan + UBSan"

step "ASan + UBSan: unit and MPI tests"
# -g1: line tables only (the sanitizers' reports keep file:line), cheaper to compile than -g.
cmake -S "$root" -B "$out/asan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_BUILD_BENCH=OFF \
  -DGFLOW_BUILD_EXAMPLES=OFF -DGFLOW_SANITIZE=address,undefined >/dev/null
# gflow_mpi_tests by name: without MPI the build fails here, rather than the stage passing with no MPI test.
cmake --build "$out/asan" -j"$jobs" --target gflow_tests gflow_mpi_tests
# Open MPI's own allocations are reported as leaks by LeakSanitizer: the mpi_ tests carry
# ASAN_OPTIONS=detect_leaks=0 (tests/mpi/CMakeLists.txt); leaks are checked in the unit run. The
# unit run (one process, 229 s here) runs beside mpi_2 and mpi_4 (-j5: mpi_4 reserves 4
# processors; 298 s on 2 cores against 353 one after the other); the lifecycle and fault tests,
# whose timeouts are 1.5 s, run after them on quiet cores.
ctest --test-dir "$out/asan" --output-on-failure --no-tests=error -j5 -R '^(unit|mpi_[0-9]+)$'
ctest --test-dir "$out/asan" --output-on-failure --no-tests=error -R '^mpi_(lifecycle|fault_)'

step "libFuzzer: kept corpora, then ${GFLOW_FUZZ_SECONDS:-10} s per target (sparse decode, gTop-k merge, layout .tsv)"
GFLOW_FUZZ_BUILD="$out/fuzz" bash "$root/scripts/fuzz.sh" "${GFLOW_FUZZ_SECONDS:-10}"

step "TSan: threaded parts"
cmake -S "$root" -B "$out/tsan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_BUILD_BENCH=OFF \
  -DGFLOW_BUILD_EXAMPLES=OFF -DGFLOW_SANITIZE=thread >/dev/null
cmake --build "$out/tsan" -j"$jobs" --target gflow_threaded_tests
TSAN_OPTIONS="halt_on_error=1" ctest --test-dir "$out/tsan" --output-on-failure --no-tests=error -R '^unit_threaded$'

step "all test stages passed"
