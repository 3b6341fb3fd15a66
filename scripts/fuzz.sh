#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, Clang with -fsanitize=fuzzer,address,undefined) in
# build-fuzz, replays each kept corpus, then fuzzes each target for the given seconds and prints
# its executions. New inputs go to a scratch corpus (the kept one is never modified); a crash,
# sanitizer report, broken invariant or slow input stops the script with the input saved under
# build-fuzz/artifacts/.
#
#   scripts/fuzz.sh [seconds-per-target]    (default 60)
#   GFLOW_FUZZ_BUILD=dir scripts/fuzz.sh    another build directory
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-60}"
out="${GFLOW_FUZZ_BUILD:-$root/build-fuzz}"
cxx="${GFLOW_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
[[ -n "$cxx" ]] || { echo "fuzz.sh: clang++ not found (libFuzzer needs Clang)" >&2; exit 1; }
targets=(fuzz_sparse_decode fuzz_sparse_merge fuzz_oktopk_block fuzz_layout_tsv)

cmake -S "$root" -B "$out" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGFLOW_FUZZ=ON \
  -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_BUILD_BENCH=OFF -DGFLOW_BUILD_EXAMPLES=OFF -DGFLOW_INSTALL=OFF >/dev/null
cmake --build "$out" -j"$(nproc)" --target "${targets[@]}"

# Every kept seed and regression input first.
ctest --test-dir "$out" --output-on-failure --no-tests=error -L fuzz

mkdir -p "$out/artifacts"
printf '\n%-20s %12s %10s %8s\n' target executions exec/s corpus
for t in "${targets[@]}"; do
  work="$out/corpus/$t"
  mkdir -p "$work"
  log="$out/$t.log"
  dict=()
  [[ -f "$root/tests/fuzz/$t.dict" ]] && dict=(-dict="$root/tests/fuzz/$t.dict")
  if ! "$out/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
      -artifact_prefix="$out/artifacts/$t-" "$work" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz.sh: $t found a failing input (see $out/artifacts/ and $log)" >&2
    exit 1
  fi
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  rate="$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  printf '%-20s %12s %10s %8s\n' "$t" "$execs" "$rate" "$(ls "$work" | wc -l)"
done
echo "fuzz.sh: no findings (${secs} s per target)"
