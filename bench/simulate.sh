#!/usr/bin/env bash
# Runs gflow's benchmark (the same suites and JSON lines as bench/run) on P simulated ranks of a
# simulated cluster, with SimGrid's SMPI (Debian: libsimgrid-dev, smpicxx / smpirun):
#
#   bench/simulate.sh run P --platform NAME|FILE [--local-work host|none|gpu-h200] [--cores C] [--fold BYTES]
#                           [--smpi-cfg NAME:VALUE ...]
#                           -- SUITE <bench/run options>
#   e.g. bench/simulate.sh run 64 --platform 10gbe -- sparse --layout resnet20 --density 0.001
#   bench/simulate.sh exec P --platform NAME|FILE [the same options] -- PROGRAM ARGS
#       any program built by smpicxx (e.g. tests/sim/bitwise.cpp, ctest sim_bitwise_16) on the same
#       simulated cluster with the same SMPI settings; its output as it prints it
#   bench/simulate.sh platforms      (lists bench/platforms/*.xml)
#   bench/simulate.sh validate P [P...] -- SUITE <options>      (root: uses bench/netem.sh)
#       for each P, back to back: the suite on bench/netem.sh's emulated 1 Gbit/s network (P ranks
#       on this host's cores), then simulated on 1gbe with this host's local work shared as on netem
#       (--cores $(nproc)); JSON lines of both ("source":"netem" / "simulated") on stdout, then
#       bench/plot.py sim's table of simulated / netem per variant on stderr.
#
# Each JSON line gains "simulated":true, "platform", "local_work", "host_slowdown",
# "folded_above_bytes" and, with --smpi-cfg (any SimGrid setting, e.g. a collective algorithm:
# smpi/alltoallv:ompi_basic_linear), "smpi_cfg". The table on stderr is the suite's own.
#
# What runs: bench/gflow_bench's sources and the gflow headers, compiled by smpicxx into
# build-sim/gflow_bench (rebuilt when a header or a bench source is newer). The exchanger, its
# engines and gflow::mpi::transport are the ones users run; SMPI's limits force two changes in the
# transport, both under #if defined(SMPI_SHARED_MALLOC) in transport/mpi/check.hpp:
#   - MPI_Comm_idup is missing: the control communicator comes from MPI_Comm_dup;
#   - SMPI's ranks are user-level contexts of one process, and MPI calls from any other thread
#     are not allowed: timeouts are not applied (no issuing thread). The overlap suite's issuing
#     threads are refused for the same reason (SMPI reports MPI_THREAD_SINGLE; the suite says so).
# Collectives: SMPI's implementations of Open MPI's algorithms, chosen by Open MPI's own decision
# rules (smpi/coll-selector:ompi), as the netem runs on Open MPI choose them (SMPI's default
# selector made ResNet-20's dense exchange at 4 ranks on 1gbe 2.5x slower: 49.6 ms against 19.4).
# One exception: where those rules pick the pairwise all_to_allv (P < 4, 64 <= P < 128,
# 256 <= P < 1024), SMPI 3.32's version of it refuses a P that is not a power of two (it aborts:
# "alltoallv pair algorithm can't be used with non power of two number of processes"); for such
# P the script selects SMPI's ring all_to_allv, which is Open MPI's pairwise exchange (step s:
# send to rank + s, receive from rank - s) for any P.
#
# Platforms (bench/platforms/, hosts named node-0 .. node-N-1, one rank per host, rank r on node-r):
#   1gbe           the gTop-k paper's cluster: nodes on one 1 Gbit/s switch (non-blocking), 50 us links
#   10gbe          a two-level fat tree (32 x 32 nodes), 10 Gbit/s links, 5 us per link
#   100g-fat-tree  the same tree, 100 Gbit/s links, 1 us per link
#   gpu-nodes      128 nodes of 8 GPUs: NVLink-class links inside a node, a 200 Gbit/s uplink per
#                  node to a non-blocking switch (bench/platforms/make_gpu_nodes.py writes it)
#   A FILE of your own works the same way: SimGrid's platform XML, hosts node-0 .. node-(P-1).
#
# Local work (what each rank computes between MPI calls: copies, selection, merges). SMPI runs the
# ranks one at a time on this host and charges each burst's measured time to the simulated clock:
#   --local-work host   (default) this host's time, one core per rank (the ranks never contend);
#                       --cores C charges it as if P ranks shared C cores (x P/C, as on netem:
#                       bench/netem.sh runs P ranks on this host's cores)
#   --local-work none   local work costs nothing: the network alone
#   --local-work gpu-h200  this host's work costs nothing; each timed iteration of the sparse suite
#                       is charged an H200's measured time for the scheme's own work instead
#                       (bench/platforms/h200_local_work.tsv: scripts/gpu-check.sh's one-rank
#                       exchange times on device memory, ResNet-50 at d = 0.001; charged with
#                       smpi_execute by bench/simulate_gpu.cpp). Not included: the work that grows
#                       with P (GTopK's merges, OkTopK's per-peer steps). A scheme, layout or
#                       density the table lacks is charged nothing; its JSON row has
#                       "gpu_local_work_s":null, the others the seconds charged.
#
# Memory: every simulated rank lives in this one process, so a run needs about P times one rank's
# memory (resnet50's sparse suite: about 0.85 GB a rank). --fold BYTES folds the pool-shaped arrays
# of at least BYTES (2, 4 or 8 bytes per pool element: pool, residual, the selection's keys, the
# benchmark's gradient; bench/simulate_fold.cpp, with malloc and operator new routed to it by
# bench/simulate_alloc.cpp): every rank's array of the same role (call stack, size, slot) is then
# the same memory. Buffers sized by k or P (received blocks, entry lists) stay each rank's own:
# folded, one rank's received block would be another's. What it changes: the ranks' pools,
# residuals and gradients are one array, so each rank computes on values the others also wrote;
# the message sizes of dense, TopK, GTopK and CSC do not depend on the values, OkTopK's do.
# Measured (ResNet-50, 16 ranks, 10gbe, --local-work none, --fold 4000000): 3.7 GB instead of
# 13.7, the same simulated time for dense, TopK, GTopK and CSC, OkTopK within 3% (1.67 ms against
# 1.69 at d = 0.001, 8.79 against 9.04 at d = 0.01) though rank 0's bytes differ (397 KB against
# 205; 2.0 MB against 3.9). Folded runs that charge this host's local work are not yet compared
# with unfolded ones: fold with --local-work none. What is left is each rank's private memory,
# nearly all of it TopK's at scale (64 ranks: TopK 10.7 GB, dense, GTopK, OkTopK 1.5-2.2 GB each;
# the sparse suite's --variants runs some schemes): without TopK, ResNet-50 runs at 256 ranks in
# 9.3 GB. GFLOW_SIM_FOLD_LOG=1 lists the blocks left private.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {
  sed -n '5,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  [[ -n "${1:-}" ]] && echo "bench/simulate.sh: $1" >&2
  exit 2
}
cmd="${1:-}"
if [[ "$cmd" == "platforms" ]]; then
  for f in "$root"/bench/platforms/*.xml; do echo "$(basename "$f" .xml)"; done
  exit 0
fi
if [[ "$cmd" == "validate" ]]; then
  shift
  Ps=()
  while (($#)) && [[ "$1" != "--" ]]; do
    [[ "$1" =~ ^[1-9][0-9]*$ ]] || usage "validate takes rank counts, then -- and the suite, got '$1'"
    Ps+=("$1"); shift
  done
  (($#)) && shift
  (($# && ${#Ps[@]})) || usage "validate P [P...] -- SUITE <options>"
  [[ -x "${GFLOW_BENCH_BUILD:-$root/build-bench}/bench/gflow_bench" ]] || { echo "bench/simulate.sh validate: build the benchmark first (bench/run builds it)" >&2; exit 2; }
  out="$(mktemp)"
  for P in "${Ps[@]}"; do
    echo "bench/simulate.sh validate: $P ranks on netem (1 Gbit/s)" >&2
    "$root/bench/netem.sh" up "$P" 1gbit
    rc=0
    "$root/bench/netem.sh" run "$P" -- "$@" | sed -u 's/^{/{"source":"netem",/' | tee -a "$out" || rc=$?
    "$root/bench/netem.sh" down "$P"
    ((rc == 0)) || exit "$rc"
    echo "bench/simulate.sh validate: $P ranks simulated on 1gbe" >&2
    "${BASH_SOURCE[0]}" run "$P" --platform 1gbe --cores "$(nproc)" -- "$@" | sed -u 's/^{/{"source":"simulated",/' | tee -a "$out"
  done
  python3 "$root/bench/plot.py" sim "$out" >&2  # simulated / netem per variant (bench/plot_sim.py)
  rm -f "$out"
  exit 0
fi
[[ "$cmd" == "run" || "$cmd" == "exec" ]] || usage "the first argument is run, exec, validate or platforms"
P="${2:-}"
[[ "$P" =~ ^[1-9][0-9]*$ ]] || usage "P must be a positive integer, got '${P}'"
shift 2
platform="" local_work=host cores="" fold=0 extra_cfg=()
while (($#)); do
  case "$1" in
    --platform) platform="${2:?--platform needs a name or a file}"; shift 2 ;;
    --local-work) local_work="${2:-}"; shift 2 ;;
    --cores) cores="${2:-}"; shift 2 ;;
    --smpi-cfg) extra_cfg+=(--cfg="${2:?--smpi-cfg needs NAME:VALUE, e.g. smpi/alltoallv:ompi_basic_linear}"); shift 2 ;;
    --fold) fold="${2:-}"; shift 2 ;;
    --) shift; break ;;
    *) usage "unknown option '$1' (the benchmark's own options go after --)" ;;
  esac
done
(($#)) || usage "the benchmark's suite and options (exec: the program and its arguments) go after --"
[[ -n "$platform" ]] || usage "--platform is required ($(cd "$root/bench/platforms" && ls *.xml | sed 's/\.xml//' | tr '\n' ' '), or an XML file)"
[[ "$local_work" == host || "$local_work" == none || "$local_work" == gpu-h200 ]] || usage "--local-work takes host, none or gpu-h200, got '$local_work'"
[[ "$local_work" == host || -z "$cores" ]] || usage "--cores shares this host's cores: it goes with --local-work host only"
[[ -z "$cores" || "$cores" =~ ^[1-9][0-9]*$ ]] || usage "--cores takes a positive integer, got '$cores'"
[[ "$fold" =~ ^[0-9]+$ ]] || usage "--fold takes a size in bytes, got '$fold'"
if [[ "$cmd" == run ]]; then
  for a in "$@"; do
    [[ "$a" == "--ranks" ]] && usage "the ranks are P (bench/simulate.sh run P), not --ranks"
    [[ "$a" == "inproc" ]] && usage "--transport inproc runs threads of one process: nothing to simulate"
  done
fi
if [[ -f "$platform" ]]; then xml="$(cd "$(dirname "$platform")" && pwd)/$(basename "$platform")"; name="$(basename "$platform" .xml)"
elif [[ -f "$root/bench/platforms/$platform.xml" ]]; then xml="$root/bench/platforms/$platform.xml"; name="$platform"
else usage "no platform '$platform' (bench/simulate.sh platforms lists them; or give an XML file)"; fi
command -v smpicxx >/dev/null && command -v smpirun >/dev/null ||
  { echo "bench/simulate.sh: smpicxx / smpirun not found: install SimGrid (bash scripts/install-deps.sh, or apt-get install libsimgrid-dev)" >&2; exit 2; }

build="${GFLOW_SIM_BUILD:-$root/build-sim}"
bin="$build/gflow_bench"
srcs=(gflow_bench.cpp common.cpp exchange.cpp overlap.cpp sparse.cpp model.cpp kernels.cpp simulate_alloc.cpp simulate_gpu.cpp)
if [[ "$cmd" == exec ]]; then
  bin="$1"; shift
  [[ -e "$bin" ]] || usage "exec: '$bin' is not a program built by smpicxx"
elif [[ ! -x "$bin" || ! -e "$build/libgflow_simfold.so" || -n "$(find "$root/include" "$root/bench" -newer "$bin" \( -name '*.[hc]pp' \) -print -quit)" ]]; then
  echo "bench/simulate.sh: building $bin with smpicxx (about 90 s on 2 cores)" >&2
  mkdir -p "$build"
  # The fold table (bench/simulate_fold.cpp) is a library of its own: SMPI gives every rank a
  # private copy of the benchmark, but loads the libraries it links once.
  g++ -std=c++20 -O2 -shared -fPIC "$root/bench/simulate_fold.cpp" -o "$build/libgflow_simfold.so" -ldl
  smpicxx -std=c++20 -O2 -DNDEBUG -DSMPI_NO_OVERRIDE_MALLOC -I"$root/include" -DGFLOW_LAYOUT_DIR="\"$root/bench/layouts\"" \
    "${srcs[@]/#/$root/bench/}" -o "$bin.tmp" -lfmt -L"$build" -lgflow_simfold -Wl,-rpath,"$build" 2> >(grep -v "^$" >&2)
  mv "$bin.tmp" "$bin"
fi

hosts="$(mktemp)"
trap 'rm -f "$hosts"' EXIT
for ((i = 0; i < P; i++)); do echo "node-$i"; done > "$hosts"
# The simulated hosts compute at 1 Gflop/s; smpi/host-speed says how fast this host is in the same
# unit, so host-speed = slowdown x 1 Gf charges each measured burst `slowdown` times its time.
slowdown=1
if [[ -n "$cores" ]] && ((P > cores)); then slowdown="$(awk -v p="$P" -v c="$cores" 'BEGIN { printf "%.6g", p / c }')"; fi
cfg=(--cfg=smpi/host-speed:"${slowdown}Gf" --cfg=smpi/coll-selector:ompi
     --log=root.thres:warning --log=smpi_coll.thres:warning --log=xbt_cfg.thres:warning --log=smpi_config.thres:warning)
[[ "$local_work" != host ]] && cfg+=(--cfg=smpi/simulate-computation:no)
export GFLOW_SIM_GPU_TIMES=""  # read by bench/simulate_gpu.cpp: the GPU's table, or none
[[ "$local_work" == gpu-h200 ]] && GFLOW_SIM_GPU_TIMES="$root/bench/platforms/h200_local_work.tsv"
if (((P & (P - 1)) != 0 && (P < 4 || (P >= 64 && P < 128) || (P >= 256 && P < 1024)))); then
  cfg+=(--cfg=smpi/alltoallv:ring)  # Open MPI's pairwise where SMPI's refuses this P (header)
fi
cfg+=("${extra_cfg[@]}")  # --smpi-cfg: after the script's own, so that it overrides them
export GFLOW_SIM_FOLD_BYTES="$fold"  # read by libgflow_simfold.so (bench/simulate_fold.cpp); 0: nothing folded
echo "bench/simulate.sh: $P simulated ranks on $name, local work: $local_work (x$slowdown), folded above: ${fold} B" >&2
tag="\"simulated\":true,\"platform\":\"$name\",\"local_work\":\"$local_work\",\"host_slowdown\":$slowdown,\"folded_above_bytes\":$fold,"
((${#extra_cfg[@]})) && tag+="\"smpi_cfg\":\"${extra_cfg[*]#--cfg=}\","
rc=0
if [[ "$cmd" == exec ]]; then
  smpirun -np "$P" -platform "$xml" -hostfile "$hosts" "${cfg[@]}" "$bin" "$@" || rc=$?
else
  smpirun -np "$P" -platform "$xml" -hostfile "$hosts" "${cfg[@]}" "$bin" "$@" | awk -v t="$tag" '/^\{/ { $0 = "{" t substr($0, 2) } { print; fflush() }' || rc=$?
fi
exit "$rc"
