#!/usr/bin/env bash
# Re-measures the tables of docs/BENCHMARKS.md: each section rewrites exactly the raw files under
# docs/results/ that its tables are read from (JSON lines on stdout -> NAME.jsonl, the bench's
# table and log on stderr -> NAME.log), and redraws the section's plot.
#   bench/measure.sh SECTION... [--repeats N]      (N runs of every configuration)
# The N runs of one configuration share its NAME.jsonl: run K's rows begin {"run":K, (in run
# order; a new run K replaces the rows of an earlier run K, the other runs' rows stay), and its log
# is NAME.log's section "==> run K <==". bench/plot.py --run K reads one run.
# Sections:
#   exchange  gflow (timed transport) and gflow_untimed against hand-written MPI: resnet50 at 2 ranks
#             (21 iterations) and 4 (15, and 201), resnet20 at 2 (15, and 10 + 200) and 4 (301),
#             gpt2_small at 2 and 4 (15) (ex_<layout>_<P>[_long].jsonl)
#   wire      fp16 and bf16 wire against the fp32 exchanger in the same run: resnet50, 4 ranks,
#             41 iterations (ex_resnet50_4_<wire>.jsonl)
#   kernels   every host kernel against a same-run copy (kernels.jsonl, docs/kernels.png)
#   sparse    dense / TopK / GTopK / CSC: resnet50, alexnet, gpt2_small at 2, 4, 8 MPI ranks and
#             2, 4 in-process ranks, resnet50 at 8 in-process ranks (sp_*.jsonl); then N runs of
#             resnet50 at d = 0.01 on 2 and 4 MPI ranks (sp_resnet50_mpi_<P>_d0.01.jsonl)
#   topology  Ring vs Hierarchical vs Hybrid on shared memory, resnet50, 4 and 8 ranks (topo_*.jsonl)
#   sweep     the fusion threshold sweep, resnet50 and gpt2_small at 2 and 4 ranks (sweep_*.jsonl,
#             docs/exchange_threshold_sweep.png)
#   overlap   the simulated-backward overlap suite, gpt2_small at 4 ranks (ov_gpt2_small_4.jsonl;
#             resnet50's overlap rows come from `loops`)
#   trace     the timeline's cost when on (gflow_traced / gflow, resnet20 and resnet50) and the
#             ResNet-50 overlap trace on 4 ranks drawn into docs/timeline_resnet50_4.png
#   model     the alpha-beta fit + local work and its error at P = 2, 4, 8 on shared memory
#             (model_resnet50_<P>.jsonl; docs/cost_model.png from run 1 of model_resnet50_8.jsonl)
#   autotune  overlap --autotune, resnet50 and gpt2_small, 4 ranks, compute ratios 0.5, 1, 2, then
#             resnet50 and resnet20 with --topology hybrid (the switch tuned too); docs/autotune.png
#   loops     the training-loop options: overlap --learn-order on shared_late (a tensor ready late)
#             and resnet50 (a control: its backward is the reverse order), 4 ranks; exchange --options
#             on resnet50 (4 ranks) and resnet20 (2 ranks); docs/learn_order.png
#   ddp       gflow against PyTorch over gloo on the same buckets (bench/ddp_gloo.sh): resnet50 at 2
#             and 4 ranks, resnet20 at 2, N repeats alternating with bench/run exchange
#             (ddp_<layout>_<P>/gflow.jsonl, gloo.jsonl, summary.txt)
#   oktopk    (as root) OkTopK beside dense / TopK / GTopK on fresh gradients (--gradients fresh):
#             resnet50 on 4 MPI ranks (shared memory, d = 0.001 and 0.01; sp_oktopk_resnet50_mpi_4)
#             and on the emulated 1 Gbit/s network at 8 and 16 ranks (d = 0.001 and 0.01;
#             net_sp_oktopk_resnet50_<P>)
#   netem     (as root) the emulated 1 Gbit/s network of bench/netem.sh: sparse (resnet50, alexnet),
#             exchange with the fp32 / fp16 / bf16 wire (resnet50), the model at P = 2, 4, 8 (net_*);
#             then the two-speed network (1 Gbit/s between groups, 10 inside) for the topologies
#   simvalidate  (as root) bench/simulate.sh validate 4 8: the sparse suite on resnet50 (d = 0.001,
#             0.01) on netem's 1 Gbit/s and simulated on 1gbe, back to back, N runs
#             (its rows of sim.jsonl); docs/sim_scale.png
#   simscale  simulated clusters (bench/simulate.sh): sparse (d = 0.001, 0.01) and exchange
#             --topology all at P = 8 .. 64 on resnet20; sparse on resnet50 at 8 and 16; on 1gbe, 10gbe and
#             gpu-nodes; the network alone (--local-work none) on 10gbe and 1gbe, resnet20 to 256
#             ranks (512 on 10gbe), resnet50 at 8 and 16 (its rows of sim.jsonl); docs/sim_scale.png
# Run it alone on the machine: a compile or a test beside it makes the numbers worthless.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/docs/results"
repeats=3
sections=()
all="exchange wire kernels sparse topology sweep overlap trace model autotune loops ddp oktopk netem simvalidate simscale"
while (($#)); do
  case "$1" in
    --repeats) repeats="$2"; shift 2 ;;
    exchange|wire|kernels|sparse|topology|sweep|overlap|trace|model|autotune|loops|ddp|oktopk|netem|simvalidate|simscale) sections+=("$1"); shift ;;
    *) echo "bench/measure.sh: unknown argument '$1' (sections: $all; --repeats N)" >&2; exit 2 ;;
  esac
done
((${#sections[@]})) || { echo "usage: bench/measure.sh ${all// /|}... [--repeats N]" >&2; exit 2; }
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "bench/measure.sh: --repeats needs a positive integer, got '$repeats'" >&2; exit 2; }
plot() { "${PYTHON:-python3}" "$root/bench/plot.py" "$@"; }  # PYTHON=/usr/bin/python3 where matplotlib is there
run() {  # run NAME ARGS...: one bench/run invocation into NAME.jsonl (stdout) and NAME.log (stderr)
  local f="$out/$1"; shift
  printf '[%s] bench/run %s > %s.jsonl\n' "$(date +%T)" "$*" "${f#$root/}" >&2
  "$root/bench/run" "$@" > "$f.jsonl" 2> "$f.log"
}
netrun() {  # netrun NAME P ARGS...: one bench/netem.sh run on P ranks (the network must be up)
  local f="$out/$1" p="$2"; shift 2
  printf '[%s] bench/netem.sh run %s -- %s > %s.jsonl\n' "$(date +%T)" "$p" "$*" "${f#$root/}" >&2
  "$root/bench/netem.sh" run "$p" -- "$@" > "$f.jsonl" 2> "$f.log"
}
addrun() {  # addrun K FILE: stdin's JSON rows as run K of FILE, replacing an earlier run K's rows
  local k="$1" f="$2"
  { if [[ -f "$f" ]]; then grep -v "^{\"run\":$k," "$f" || (($? == 1)); fi; sed "s/^{/{\"run\":$k,/"; } |  # grep: 1 = no row left
    LC_ALL=C sort -s -t: -k2,2n > "$f.tmp"
  mv "$f.tmp" "$f"
}
logrun() {  # logrun K FILE: FILE (a log) without its section of run K, then the header of run K
  local k="$1" f="$2"
  if [[ -f "$f" ]]; then
    awk -v h="==> run $k <==" '/^==> run [0-9]+ <==$/ { skip = ($0 == h) } !skip' "$f" > "$f.tmp"
    mv "$f.tmp" "$f"
  fi
  printf '==> run %s <==\n' "$k" >> "$f"
}
runk() {  # runk K NAME ARGS...: run K of one bench/run invocation into NAME.jsonl and NAME.log
  local k="$1" f="$out/$2"; shift 2
  printf '[%s] bench/run %s > %s.jsonl (run %s)\n' "$(date +%T)" "$*" "${f#$root/}" "$k" >&2
  logrun "$k" "$f.log"
  "$root/bench/run" "$@" 2>> "$f.log" | addrun "$k" "$f.jsonl"
}
netrunk() {  # netrunk K NAME P ARGS...: run K of one bench/netem.sh run on P ranks (the network must be up)
  local k="$1" f="$out/$2" p="$3"; shift 3
  printf '[%s] bench/netem.sh run %s -- %s > %s.jsonl (run %s)\n' "$(date +%T)" "$p" "$*" "${f#$root/}" "$k" >&2
  logrun "$k" "$f.log"
  "$root/bench/netem.sh" run "$p" -- "$@" 2>> "$f.log" | addrun "$k" "$f.jsonl"
}
# Section 10 keeps every simulated row in one file, docs/results/sim.jsonl: the validation's rows
# begin {"run":N,"source":...}, the model's carry "suite":"model", the scale runs are the rest. Each
# section replaces only its own rows; the suites' tables go to stderr.
simfile="$out/sim.jsonl"
simkeep() {  # simkeep GREP-ARGS...: keep only the rows of sim.jsonl that grep selects
  [[ -f "$simfile" ]] || return 0
  grep "$@" "$simfile" > "$simfile.tmp" || (($? == 1))  # 1: no row kept; 2 (an error) stops the script
  mv "$simfile.tmp" "$simfile"
}
simrun() {  # simrun P PLATFORM [--local-work none] ARGS...: one bench/simulate.sh run, appended to sim.jsonl
  local p="$1" pf="$2" lw=host; shift 2
  [[ "${1:-}" == "--local-work" ]] && { lw="$2"; shift 2; }
  printf '[%s] bench/simulate.sh run %s --platform %s --local-work %s -- %s >> %s\n' "$(date +%T)" "$p" "$pf" "$lw" "$*" "${simfile#$root/}" >&2
  "$root/bench/simulate.sh" run "$p" --platform "$pf" --local-work "$lw" -- "$@" >> "$simfile" ||
    printf 'FAILED (exit %s): bench/simulate.sh run %s --platform %s --local-work %s -- %s\n' "$?" "$p" "$pf" "$lw" "$*" >&2
}
for s in "${sections[@]}"; do
  case "$s" in
    simvalidate)  # section 10: simulated 1gbe against netem's 1 Gbit/s, back to back, N runs
      simkeep -v '^{"run":'
      for r in $(seq 1 "$repeats"); do
        printf '[%s] bench/simulate.sh validate 4 8 -- sparse --layout resnet50 (run %s)\n' "$(date +%T)" "$r" >&2
        "$root/bench/simulate.sh" validate 4 8 -- sparse --layout resnet50 --density 0.001,0.01 --iters 7 --warmup 3 |
          sed "s/^{/{\"run\":$r,/" >> "$simfile"
      done
      plot sim "$simfile" -o "$root/docs/sim_scale.png" ;;
    simscale)  # section 10: P = 8 .. 64 simulated (resnet50 to 16 ranks: each rank's memory is real)
      simkeep -E '^\{"run":|"suite":"model"'
      for pf in 1gbe 10gbe gpu-nodes; do
        for p in 8 16 32 64; do
          simrun "$p" "$pf" sparse --layout resnet20 --density 0.001,0.01 --iters 7 --warmup 3
          simrun "$p" "$pf" exchange --layout resnet20 --topology all --iters 7 --warmup 3
        done
        # every simulated rank's buffers are real memory: about 0.6 GB a rank for the sparse suite
        # (exchange --topology all on resnet50 did not finish in 8 minutes at 8 ranks: left out)
        for p in 8 16; do simrun "$p" "$pf" sparse --layout resnet50 --density 0.001,0.01 --iters 7 --warmup 3; done
      done
      # the network alone (no local work charged): to 256 ranks on ResNet-20, 512 on 10gbe (128: 4
      # minutes on 10gbe, 14 on 1gbe: SimGrid's handling of the linear all_to_allv), 16 on ResNet-50
      for pf in 10gbe 1gbe; do
        for p in 8 16 32 64 128 256; do simrun "$p" "$pf" --local-work none sparse --layout resnet20 --density 0.001,0.01 --iters 7 --warmup 3; done
        [[ "$pf" == 10gbe ]] && simrun 512 "$pf" --local-work none sparse --layout resnet20 --density 0.001,0.01 --iters 7 --warmup 3  # 9 minutes, 15.7 GB
        for p in 8 16; do simrun "$p" "$pf" --local-work none sparse --layout resnet50 --density 0.001,0.01 --iters 7 --warmup 3; done
      done
      plot sim "$simfile" -o "$root/docs/sim_scale.png" ;;
    exchange)
      for r in $(seq 1 "$repeats"); do  # repeats interleaved across configurations
        runk "$r" ex_resnet50_2 exchange --layout resnet50 --ranks 2 --iters 21
        runk "$r" ex_resnet50_4 exchange --layout resnet50 --ranks 4
        runk "$r" ex_resnet50_4_long exchange --layout resnet50 --ranks 4 --iters 201
        runk "$r" ex_resnet20_2 exchange --layout resnet20 --ranks 2
        runk "$r" ex_resnet20_2_long exchange --layout resnet20 --ranks 2 --iters 200 --warmup 10
        runk "$r" ex_resnet20_4_long exchange --layout resnet20 --ranks 4 --iters 301
        for p in 2 4; do runk "$r" "ex_gpt2_small_${p}" exchange --layout gpt2_small --ranks "$p"; done
      done ;;
    ddp)
      for c in "resnet50 2" "resnet50 4" "resnet20 2"; do
        set -- $c
        d="$out/ddp_$1_$2"
        printf '[%s] bench/ddp_gloo.sh --layout %s --ranks %s --repeats %s > %s/summary.txt\n' "$(date +%T)" "$1" "$2" "$repeats" "${d#$root/}" >&2
        "$root/bench/ddp_gloo.sh" --layout "$1" --ranks "$2" --repeats "$repeats" --out "$d" > "$d.summary.txt" 2> "$d.log"
        mv "$d.summary.txt" "$d/summary.txt"; mv "$d.log" "$d/run.log"
      done ;;
    wire)
      for r in $(seq 1 "$repeats"); do
        for w in fp16 bf16; do runk "$r" "ex_resnet50_4_${w}" exchange --layout resnet50 --ranks 4 --wire "$w" --iters 41; done
      done ;;
    kernels)
      run kernels kernels --layout resnet50,gpt2_small
      plot kernels "$out/kernels.jsonl" -o "$root/docs/kernels.png" ;;
    sparse)
      for l in resnet50 alexnet gpt2_small; do
        for p in 2 4 8; do run "sp_${l}_mpi_${p}" sparse --layout "$l" --ranks "$p" --quick; done
        for p in 2 4; do run "sp_${l}_inproc_${p}" sparse --layout "$l" --ranks "$p" --transport inproc --quick; done
      done
      run sp_resnet50_inproc_8 sparse --layout resnet50 --ranks 8 --transport inproc --quick
      for r in $(seq 1 "$repeats"); do  # d = 0.01 on ResNet-50, where runs disagree: N runs each
        for p in 2 4; do runk "$r" "sp_resnet50_mpi_${p}_d0.01" sparse --layout resnet50 --ranks "$p" --density 0.01 --quick; done
      done ;;
    topology)
      for p in 4 8; do run "topo_resnet50_${p}" exchange --layout resnet50 --ranks "$p" --topology all --quick; done ;;
    sweep)
      for l in resnet50 gpt2_small; do
        for p in 2 4; do run "sweep_${l}_${p}" exchange --layout "$l" --ranks "$p" --sweep; done
      done
      plot sweep "$out"/sweep_*.jsonl -o "$root/docs/exchange_threshold_sweep.png" ;;
    overlap)
      run ov_gpt2_small_4 overlap --layout gpt2_small --ranks 4 ;;
    trace)
      tmp="$(mktemp -d)"  # the traces of the cost runs are not kept, only their timings
      for r in $(seq 1 "$repeats"); do
        runk "$r" trace_cost_resnet20_2 exchange --layout resnet20 --ranks 2 --iters 300 --warmup 10 --trace "$tmp/exchange_resnet20_2.json"
        runk "$r" trace_cost_resnet50_4 exchange --layout resnet50 --ranks 4 --quick --trace "$tmp/exchange_resnet50_4.json"
      done
      rm -rf "$tmp"
      run trace_overlap_resnet50_4 overlap --layout resnet50 --ranks 4 --quick --compute-ratio 1 --trace "$out/trace_overlap_resnet50_4.json"
      plot trace "$out/trace_overlap_resnet50_4.json" -o "$root/docs/timeline_resnet50_4.png" ;;
    model)
      for r in $(seq 1 "$repeats"); do  # the check compares medians over repeats (docs/BENCHMARKS.md)
        for p in 2 4 8; do runk "$r" "model_resnet50_${p}" model --layout resnet50 --ranks "$p" --reps 15 --iters 15; done
      done
      plot model "$out"/model_resnet50_[248].jsonl   # the tables: fits, checks, predictions
      plot model "$out/model_resnet50_8.jsonl" --run 1 -o "$root/docs/cost_model.png" ;;
    autotune)
      for r in $(seq 1 "$repeats"); do
        for l in resnet50 gpt2_small; do
          runk "$r" "autotune_${l}_4" overlap --layout "$l" --ranks 4 --autotune --compute-ratio 0.5,1,2
        done
        for l in resnet50 resnet20; do
          runk "$r" "autotune_hybrid_${l}_4" overlap --layout "$l" --ranks 4 --autotune --topology hybrid --compute-ratio 0.5,1,2
        done
      done
      plot tuner "$out"/autotune_*_4.jsonl
      plot autotune "$out"/autotune_resnet50_4.jsonl "$out"/autotune_gpt2_small_4.jsonl -o "$root/docs/autotune.png" > /dev/null ;;
    loops)
      for r in $(seq 1 "$repeats"); do
        for l in shared_late resnet50; do runk "$r" "loops_overlap_${l}_4" overlap --layout "$l" --ranks 4 --learn-order --quick; done
        runk "$r" loops_options_resnet50_4 exchange --layout resnet50 --ranks 4 --options
        runk "$r" loops_options_resnet20_2 exchange --layout resnet20 --ranks 2 --options
      done
      plot loops "$out"/loops_*.jsonl -o "$root/docs/learn_order.png" ;;
    oktopk)
      [[ "$(id -u)" == 0 ]] || { echo "bench/measure.sh oktopk: run as root (bench/netem.sh makes network namespaces)" >&2; exit 2; }
      for r in $(seq 1 "$repeats"); do
        runk "$r" sp_oktopk_resnet50_mpi_4 sparse --layout resnet50 --ranks 4 --density 0.001,0.01 --gradients fresh --warmup 30 --iters 7
      done
      for p in 8 16; do
        "$root/bench/netem.sh" down "$p" > /dev/null  # idempotent: whatever an earlier run left
        "$root/bench/netem.sh" up "$p" 1gbit > /dev/null
        for r in $(seq 1 "$repeats"); do
          netrunk "$r" "net_sp_oktopk_resnet50_${p}" "$p" sparse --layout resnet50 --density 0.001,0.01 --gradients fresh --warmup 30 --iters 7
        done
        "$root/bench/netem.sh" down "$p" > /dev/null
      done ;;
    netem)
      [[ "$(id -u)" == 0 ]] || { echo "bench/measure.sh netem: run as root (bench/netem.sh makes network namespaces)" >&2; exit 2; }
      "$root/bench/run" kernels --layout resnet20 > /dev/null 2>&1  # builds the benchmark as bench/run does
      "$root/bench/netem.sh" down 8 > /dev/null  # idempotent: whatever an earlier run left
      "$root/bench/netem.sh" up 4 1gbit > /dev/null
      netrun net_sp_resnet50_4 4 sparse --layout resnet50 --quick --density 0.001,0.01
      netrun net_sp_alexnet_4 4 sparse --layout alexnet --quick --density 0.001,0.01
      netrun net_ex_resnet50_4 4 exchange --layout resnet50 --quick
      for w in fp16 bf16; do netrun "net_ex_resnet50_4_$w" 4 exchange --layout resnet50 --quick --wire "$w"; done
      "$root/bench/netem.sh" down 4 > /dev/null
      for r in $(seq 1 "$repeats"); do
        for p in 2 4 8; do
          "$root/bench/netem.sh" up "$p" 1gbit > /dev/null
          if ! netrunk "$r" "net_model_resnet50_${p}" "$p" model --layout resnet50 --reps 15 --iters 15; then
            "$root/bench/netem.sh" down "$p" > /dev/null
            echo "bench/measure.sh netem: the network model run on $p ranks failed; see run $r in $out/net_model_resnet50_${p}.log" >&2
            exit 1
          fi
          "$root/bench/netem.sh" down "$p" > /dev/null
        done
      done
      for pg in "4 2" "8 4"; do
        read -r p g <<< "$pg"
        "$root/bench/netem.sh" up "$p" 1gbit "$g" 10gbit > /dev/null
        netrun "net_topo_resnet50_$p" "$p" exchange --topology all --layout resnet50 --quick
        "$root/bench/netem.sh" down "$p" > /dev/null
      done ;;
  esac
done
echo "[$(date +%T)] done" >&2
