#!/usr/bin/env bash
# Chaos run of issue 25 on the emulated network (bench/netem.sh): the MLP trainer with a sparse
# composition (train_csc) on N ranks, one network namespace each, 1 Gbit/s per rank's link;
# on one rank's link 1% packet loss (sch_netem, or where it is missing a tc BPF classifier:
# bench/loss.bpf.c, needs clang) and 50 ms latency spikes; one rank paused (SIGSTOP) past the
# transport's timeout and then resumed (SIGCONT); a checkpoint set every K steps.
#
#   sudo bench/chaos.sh            (GFLOW_BUILD=<build dir>, default build/; CHAOS_WORK=<dir>, default /tmp/gflow-chaos)
#
# It prints: the faults injected (and any the kernel refused, with tc's message; the packets the
# loss dropped and the TCP retransmissions it caused), each survivor's
# time to detect the pause (from SIGSTOP to its TIMEOUT line; and the trainer's own detected_ms),
# whether every survivor raised a typed timeout_error naming the paused rank, whether the job
# ended (none hangs: bounded by `timeout`), whether a checkpoint was left half-written (*.tmp),
# and whether the newest complete set restarts on N - 1 ranks (on the same network, the loss still
# on) with every residual element conserved (the trainer's RESHARD line): data lost, target none.
# A functional run, not a benchmark.
#
# --fault-rank R with --fault-at beyond the run marks the job as a fault test: a survivor prints
# its TIMEOUT line and leaves with status 0 (Open MPI would otherwise end the others on the first
# non-zero status, before they report); rank R is not made to exit, it is paused from outside.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GFLOW_BUILD:-$root/build}"
exe="$build/examples/train_csc"
work="${CHAOS_WORK:-/tmp/gflow-chaos}"
N=4 RATE=1gbit TIMEOUT_MS=3000 K=25
LINK_RANK=1       # its link gets the loss and the latency spikes
PAUSE_RANK=2      # paused with SIGSTOP ...
PAUSE_AFTER=50    # ... once rank 0 has printed the set of this iteration
PAUSE_MS=$((2 * TIMEOUT_MS))
SPIKE_MS=50 SPIKE_EVERY_MS=500
train=(--epochs 4 --train-limit 12800 --batch 32 --warmup-iters 20 --seed 25)

[[ $EUID -eq 0 ]] || { echo "chaos: needs root (network namespaces and tc); run it with sudo" >&2; exit 2; }
[[ -x "$exe" ]] || { echo "chaos: build the trainer first: cmake --build build --target train_csc" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work"
netem="$root/bench/netem.sh"
"$netem" down "$N" 2>/dev/null
trap '"$netem" down "$N" 2>/dev/null; [[ -n "${spiker:-}" ]] && kill "$spiker" 2>/dev/null' EXIT
"$netem" up "$N" "$RATE" || { echo "chaos: bench/netem.sh up $N $RATE failed (network namespaces or tbf unavailable)"; exit 1; }

# ---- faults on rank LINK_RANK's link --------------------------------------------------------
dev="gfv$LINK_RANK"
tcx=(ip netns exec "gflow_r$LINK_RANK" tc)
limit=20mb  # the same fifo limit in every tbf setting below: a change keeps the queue
"${tcx[@]}" qdisc replace dev "$dev" root handle 1: tbf rate "$RATE" burst 4mb limit "$limit"
loss="1% random loss: injected (sch_netem under the tbf)"
loss_how=netem
spike_how=netem
if ! err=$("${tcx[@]}" qdisc add dev "$dev" parent 1:1 handle 10: netem loss 1% 2>&1); then
  # No sch_netem: a BPF classifier on the clsact qdisc's egress hook drops 1% of the packets
  # before they reach the tbf (bench/loss.bpf.c).
  spike_how=tbf
  loss_how=bpf
  cc=(clang -O2 -target bpf -I"/usr/include/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)" -DLOSS_PER_MILLE=10)
  if ! err2=$("${cc[@]}" -c "$root/bench/loss.bpf.c" -o "$work/loss.o" 2>&1); then
    loss="1% random loss: NOT injected: no sch_netem ('netem loss 1%': ${err//$'\n'/ }) and bench/loss.bpf.c does not compile: ${err2//$'\n'/ }"
    loss_how=none
  elif ! err2=$({ "${tcx[@]}" qdisc add dev "$dev" clsact && "${tcx[@]}" filter add dev "$dev" egress bpf da obj "$work/loss.o" sec classifier; } 2>&1); then
    loss="1% random loss: NOT injected: no sch_netem ('netem loss 1%': ${err//$'\n'/ }), and the BPF classifier was refused: ${err2//$'\n'/ }"
    loss_how=none
  else
    loss="1% random loss: injected (no sch_netem: bench/loss.bpf.c, a tc BPF classifier on the clsact egress hook, ahead of the tbf)"
  fi
fi
# Evidence that packets are dropped: the link's counters before and after the run.
dropped() {  # packets the loss dropped so far on the link
  case $loss_how in
    bpf) "${tcx[@]}" -s qdisc show dev "$dev" | awk '/^qdisc clsact/ {c = 1} c && /dropped/ {gsub(",", "", $7); print $7; exit}' ;;
    netem) "${tcx[@]}" -s qdisc show dev "$dev" | awk '/^qdisc netem/ {c = 1} c && /dropped/ {gsub(",", "", $7); print $7; exit}' ;;
    *) echo 0 ;;
  esac
}
counters() {  # packets sent on the link, TCP segments rank LINK_RANK retransmitted
  echo "$(ip netns exec "gflow_r$LINK_RANK" cat "/sys/class/net/$dev/statistics/tx_packets") $(ip netns exec "gflow_r$LINK_RANK" nstat -asz TcpRetransSegs | awk '/TcpRetransSegs/ {print $2}') $(dropped)"
}
read -r tx0 retrans0 drop0 <<<"$(counters)"
# A latency spike: with netem, 50 ms of added delay; without it, the link stalled for 50 ms (the
# tbf at 8 bit/s with a one-packet bucket: what is sent waits in the queue and leaves, 50 ms
# late at most, when the rate comes back).
spike() {
  if [[ $spike_how == netem ]]; then
    "${tcx[@]}" qdisc change dev "$dev" parent 1:1 handle 10: netem loss 1% delay "${SPIKE_MS}ms"
    sleep "0.0${SPIKE_MS}"
    "${tcx[@]}" qdisc change dev "$dev" parent 1:1 handle 10: netem loss 1%
  else
    "${tcx[@]}" qdisc change dev "$dev" root handle 1: tbf rate 8bit burst 1600 limit "$limit"
    sleep "0.0${SPIKE_MS}"
    "${tcx[@]}" qdisc change dev "$dev" root handle 1: tbf rate "$RATE" burst 4mb limit "$limit"
  fi
}
# The link as it is between spikes (the spiker may be stopped inside spike(), before its second
# change: this puts the link back).
unspike() {
  if [[ $spike_how == netem ]]; then
    "${tcx[@]}" qdisc change dev "$dev" parent 1:1 handle 10: netem loss 1%
  elif [[ $spike_how == tbf ]]; then
    "${tcx[@]}" qdisc change dev "$dev" root handle 1: tbf rate "$RATE" burst 4mb limit "$limit"
  fi
}
if ! err=$(spike 2>&1); then
  echo "chaos: a latency spike could not be applied: $err"
  spike_how=none
fi
(
  n=0
  while [[ $spike_how != none ]]; do
    sleep "0.$SPIKE_EVERY_MS"
    spike 2>/dev/null && n=$((n + 1)) && echo "$n" >"$work/spikes"
  done
) &
spiker=$!

# ---- the run -------------------------------------------------------------------------------
export OMPI_MCA_orte_allowed_exit_without_sync=1
pause() {  # SIGSTOP rank PAUSE_RANK, SIGCONT after PAUSE_MS
  local pid
  pid=$(ip netns pids "gflow_r$PAUSE_RANK" | head -1)
  [[ -n "$pid" ]] || { echo "chaos: no process in gflow_r$PAUSE_RANK" >"$work/pause"; return; }
  kill -STOP "$pid" && echo "$(date +%s.%N) $pid" >"$work/pause"
  sleep "$((PAUSE_MS / 1000)).$(printf %03d $((PAUSE_MS % 1000)))"
  kill -CONT "$pid" && echo "$(date +%s.%N)" >"$work/resume"
}
t0=$(date +%s.%N)
timeout 180 "$netem" exec "$N" -- "$exe" "${train[@]}" --checkpoint-every "$K" --checkpoint-dir "$work/ckpt" \
  --timeout-ms "$TIMEOUT_MS" --fault-rank "$PAUSE_RANK" --fault-at 999999999 2>&1 |
  {
    while IFS= read -r line; do
      printf '%s %s\n' "$(date +%s.%N)" "$line"
      [[ "$line" == "CHECKPOINT iteration=$PAUSE_AFTER "* ]] && pause &
    done
    wait  # the pause's SIGCONT
  } >"$work/run.log"
rc=${PIPESTATUS[0]}
kill "$spiker" 2>/dev/null; wait "$spiker" 2>/dev/null; spiker=""
unspike  # the restart below runs on this network: never on a link left stalled by a killed spike
read -r tx1 retrans1 drop1 <<<"$(counters)"
t1=$(date +%s.%N)

# ---- what happened ---------------------------------------------------------------------------
echo "== chaos run: $N ranks (train_csc), $RATE per link, timeout ${TIMEOUT_MS} ms, a set every $K steps; $(date -u '+%F %H:%M UTC'), $(uname -n)"
echo "faults injected:"
echo "  rank $LINK_RANK's link: $loss"
ndrop=$((${drop1:-0} - ${drop0:-0})); ntx=$((${tx1:-0} - ${tx0:-0}))
echo "    during the run: $ndrop packets dropped by the loss, $ntx sent on the link ($(awk "BEGIN{printf \"%.2f\", ($ndrop + $ntx) ? 100 * $ndrop / ($ndrop + $ntx) : 0}")% dropped); rank $LINK_RANK's TCP retransmitted $((${retrans1:-0} - ${retrans0:-0})) segments"
echo "  rank $LINK_RANK's link: latency spikes of ${SPIKE_MS} ms every ${SPIKE_EVERY_MS} ms ($spike_how): $(cat "$work/spikes" 2>/dev/null || echo 0) applied"
if [[ -s "$work/pause" && "$(cut -d' ' -f1 "$work/pause")" != chaos:* ]]; then
  read -r t_stop pid <"$work/pause"
  echo "  rank $PAUSE_RANK (pid $pid) paused with SIGSTOP for ${PAUSE_MS} ms once rank 0 had printed the set of iteration $PAUSE_AFTER (the step it stopped in shows in the survivors' lines), then SIGCONT: $( [[ -s $work/resume ]] && echo resumed || echo 'not resumed (the job had ended)')"
else
  echo "  rank $PAUSE_RANK: NOT paused ($(cat "$work/pause" 2>/dev/null || echo "the job never printed the set of iteration $PAUSE_AFTER"))"
  t_stop=""
fi
printf 'job ended: exit %s after %.1f s%s\n' "$rc" "$(awk "BEGIN{print $t1 - $t0}")" "$( ((rc == 124)) && echo ' (HUNG: killed by timeout 180)')"
all_typed=yes
for ((q = 0; q < N; q++)); do
  ((q == PAUSE_RANK)) && continue
  l=$(grep -m1 " TIMEOUT rank=$q " "$work/run.log")
  if [[ -z "$l" ]]; then
    echo "survivor $q: NO typed error"; all_typed=no; continue
  fi
  t=${l%% *}
  ms=$(sed -n 's/.* detected_ms=\([0-9]*\).*/\1/p' <<<"$l"); step=$(sed -n 's/.* step=\([0-9]*\).*/\1/p' <<<"$l")
  subj=$(sed -n 's/.* subject=\([a-z_]*\).*/\1/p' <<<"$l")
  names=no; grep -Eq "what=.*rank\(s\) [0-9, ]*\b$PAUSE_RANK\b" <<<"$l" && names=yes
  [[ $names == yes ]] || all_typed=no
  since=""; [[ -n "$t_stop" ]] && since=$(printf '%.0f ms after SIGSTOP, ' "$(awk "BEGIN{print ($t - $t_stop) * 1000}")")
  echo "survivor $q: timeout_error in '$subj' at step $step: ${since}detected_ms=$ms; names rank $PAUSE_RANK: $names"
done
l=$(grep -m1 " TIMEOUT rank=$PAUSE_RANK " "$work/run.log" || true)
if [[ -n "$l" ]]; then echo "paused rank $PAUSE_RANK after SIGCONT: $(sed 's/^[0-9.]* //' <<<"$l" | cut -c1-200) ..."
else echo "paused rank $PAUSE_RANK after SIGCONT: no TIMEOUT line (it ended without one: Open MPI, or its peers leaving)"; fi
echo "every survivor raised a typed error naming rank $PAUSE_RANK: $all_typed"
tmps=$(find "$work/ckpt" -name '*.tmp' 2>/dev/null | wc -l)
echo "half-written checkpoint files (*.tmp): $tmps"
sets=""
for d in $(find "$work/ckpt" -mindepth 1 -maxdepth 1 -type d -name 'iter-*' 2>/dev/null | sort -V); do
  sets+=" $(basename "$d") ($(find "$d" -name 'rank-*.gflow' | wc -l) of $N rank files)"
done
echo "checkpoint sets:${sets:- none}"

# ---- restart on N - 1 ranks from the newest complete set, on the same network: ranks 0 .. N-2 in
# their namespaces, rank LINK_RANK's link still losing 1% (the spikes have stopped) ----
read -r tx0 retrans0 drop0 <<<"$(counters)"
timeout 180 "$netem" exec $((N - 1)) -- "$exe" "${train[@]}" --epochs 1 --resume "$work/ckpt" --timeout-ms "$TIMEOUT_MS" >"$work/restart.log" 2>&1
rrc=$?
read -r tx1 retrans1 drop1 <<<"$(counters)"
"$netem" down "$N" 2>/dev/null
res=$(grep -m1 '^RESUMED' "$work/restart.log"); rs=$(grep -m1 '^RESHARD' "$work/restart.log")
echo "restart on $((N - 1)) ranks (the same emulated network, the loss on rank $LINK_RANK's link): exit $rrc; ${res:-no RESUMED line}"
echo "  ${rs:-no RESHARD line}"
ndrop=$((${drop1:-0} - ${drop0:-0})); ntx=$((${tx1:-0} - ${tx0:-0}))
echo "  during the restart: $ndrop packets dropped by the loss, $ntx sent on the link; rank $LINK_RANK's TCP retransmitted $((${retrans1:-0} - ${retrans0:-0})) segments; $(grep -c '^TIMEOUT ' "$work/restart.log") timeouts"
rl=$(grep -m1 '^RESULT' "$work/restart.log" | cut -d' ' -f1-6)
echo "  ${rl:-no RESULT line}"
lost=unknown
if [[ $rrc -eq 0 && -n "$rs" ]]; then
  e=$(sed -n 's/.* elements=\([0-9]*\).*/\1/p' <<<"$rs"); w=$(sed -n 's/.* within_rounding=\([0-9]*\).*/\1/p' <<<"$rs")
  ((e == w && e > 0)) && lost=none || lost="$((e - w)) residual elements not conserved"
fi
stop_step=$(grep -v " TIMEOUT rank=$PAUSE_RANK " "$work/run.log" | sed -n 's/.* TIMEOUT rank=[0-9]* step=\([0-9]*\).*/\1/p' | sort -n | head -1)
at=$(sed -n 's/^RESUMED iteration=\([0-9]*\).*/\1/p' <<<"$res")
echo "data lost: $lost (residuals); steps to compute again: $(( ${stop_step:-0} - ${at:-0} )) (from the set of iteration ${at:-?} to the step the survivors stopped in, ${stop_step:-?})"
echo "logs: $work/run.log, $work/restart.log"
