#!/usr/bin/env bash
# Emulates a slower network on this one machine: one network namespace per rank, each with a
# veth into a bridge in a hub namespace, and a tbf rate limit on each rank's egress (a node's
# NIC). Addresses are link-local (169.254.77.0/24) and live only in namespaces this script makes.
# Open MPI is forced onto TCP over those interfaces (no shared memory).
#
#   sudo bench/netem.sh up N RATE      e.g. up 4 1gbit   (tbf rates: kbit, mbit, gbit)
#   sudo bench/netem.sh up N RATE G INTRA
#                                      two-speed network: ranks in groups of G consecutive ranks
#                                      (as Topology<Hierarchical<G>> forms them); traffic between
#                                      groups at RATE, inside a group at INTRA (e.g. up 4 1gbit 2 10gbit)
#   sudo bench/netem.sh run N -- ARGS  runs bench/gflow_bench ARGS on N ranks, one per namespace
#   sudo bench/netem.sh exec N -- PROGRAM ARGS
#                                      runs any MPI program (e.g. a trainer) the same way
#   sudo bench/netem.sh down N
# tbf's burst is kept well above the MTU and GSO segment sizes, or packets are dropped. Its 4 MB
# also lets a message of up to 4 MB that follows a pause leave at the veth's speed (sparse schemes'
# messages after their local work); a 256 kB burst or a tbf peak rate cost TCP half its throughput
# here, and sch_netem's rate is not in this kernel (docs/BENCHMARKS.md, the cost model on netem).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; n="${2:-}"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "usage: bench/netem.sh up N RATE | run N -- ARGS | exec N -- PROGRAM ARGS | down N" >&2; exit 2; }
ns() { echo "gflow_r$1"; }
case "$cmd" in
  up)
    rate="${3:?rate, e.g. 1gbit}"
    group="${4:-}"; intra="${5:-}"
    if [[ -n "$group" ]]; then
      [[ "$group" =~ ^[1-9][0-9]*$ && -n "$intra" ]] || { echo "netem: up N RATE G INTRA: G is the group size, INTRA the rate inside a group" >&2; exit 2; }
    fi
    # The bridge lives in the root namespace with its own address: mpiexec's PMIx server runs
    # there, and the ranks reach it over the bridge (PMIx 3 has no Unix-socket transport).
    ip link add gfbr type bridge
    ip addr add 169.254.77.254/24 dev gfbr
    ip link set gfbr up
    for ((i = 0; i < n; i++)); do
      ip netns add "$(ns $i)"
      ip link add "gfv$i" type veth peer name "gfp$i"
      ip link set "gfv$i" netns "$(ns $i)"
      ip link set "gfp$i" master gfbr up
      ip netns exec "$(ns $i)" ip addr add "169.254.77.$((i + 1))/24" dev "gfv$i"
      ip netns exec "$(ns $i)" ip link set lo up
      ip netns exec "$(ns $i)" ip link set "gfv$i" up
      if [[ -z "$group" ]]; then
        ip netns exec "$(ns $i)" tc qdisc add dev "gfv$i" root tbf rate "$rate" burst 4mb latency 100ms
        continue
      fi
      # Two classes: 1:10 (inside the group, the default) and 1:20 (to every rank of another
      # group, chosen by destination address).
      x=(ip netns exec "$(ns $i)" tc)
      "${x[@]}" qdisc add dev "gfv$i" root handle 1: htb default 10
      "${x[@]}" class add dev "gfv$i" parent 1: classid 1:10 htb rate "$intra" ceil "$intra" burst 4mb cburst 4mb quantum 60000
      "${x[@]}" class add dev "gfv$i" parent 1: classid 1:20 htb rate "$rate" ceil "$rate" burst 4mb cburst 4mb quantum 60000
      for ((j = 0; j < n; j++)); do
        ((j / group == i / group)) && continue
        "${x[@]}" filter add dev "gfv$i" parent 1: protocol ip prio 1 u32 match ip dst "169.254.77.$((j + 1))/32" flowid 1:20
      done
    done
    if [[ -n "$group" ]]; then echo "netem: $n namespaces, groups of $group: $intra inside, $rate between" >&2
    else echo "netem: $n namespaces at $rate each" >&2; fi ;;
  down)
    for ((i = 0; i < n; i++)); do ip netns del "$(ns $i)" 2>/dev/null || true; done
    # A namespace still held by an exiting process lives on, and so does its veth's peer here:
    # delete the peers too, or the next `up` finds them ("File exists").
    for l in $(ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(gfp[0-9]*\)@.*/\1/p'); do ip link del "$l" 2>/dev/null || true; done
    ip link del gfbr 2>/dev/null || true ;;
  run | exec)
    shift 2; [[ "${1:-}" == "--" ]] && shift
    if [[ "$cmd" == run ]]; then
      build="${GFLOW_BENCH_BUILD:-$root/build-bench}"
      [[ -x "$build/bench/gflow_bench" ]] || { echo "netem: build bench first (bench/run builds it)" >&2; exit 2; }
      set -- "$build/bench/gflow_bench" "$@"
    else
      [[ -x "${1:-}" ]] || { echo "netem: exec N -- PROGRAM ARGS: '${1:-}' is not an executable" >&2; exit 2; }
      prog="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
      shift
      set -- "$prog" "$@"
    fi
    app=()
    for ((i = 0; i < n; i++)); do
      ((i)) && app+=(":")
      app+=(-n 1 ip netns exec "$(ns $i)" "$@")
    done
    export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=169.254.77.0/24
    exec mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca btl tcp,self \
      --mca oob_tcp_if_include 169.254.77.0/24 \
      --mca btl_tcp_if_include 169.254.77.0/24 "${app[@]}" ;;
  *) echo "usage: bench/netem.sh up N RATE | run N -- ARGS | exec N -- PROGRAM ARGS | down N" >&2; exit 2 ;;
esac
