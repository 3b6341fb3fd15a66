#!/usr/bin/env bash
# Re-measures the tables of docs/BENCHMARKS.md into docs/results/*.jsonl, section by section.
#   bench/measure.sh SECTION... [--repeats N]
# Sections:
#   exchange  gflow (timed transport) vs gflow_untimed vs hand-written MPI: resnet50, gpt2_small,
#             resnet20 at 2 and 4 ranks, N repeats each (ex_<layout>_<P>[_rK].jsonl)
#   wire      fp16 and bf16 wire against the fp32 exchange in the same run: resnet50, 4 ranks
#   kernels   every host kernel against a same-run copy (kernels.jsonl)
#   sparse    dense / TopK / GTopK / CSC: resnet50, alexnet, gpt2_small at 2, 4, 8 MPI ranks and
#             2, 4 in-process ranks, resnet50 at 8 in-process ranks (sp_*.jsonl)
#   topology  Ring vs Hierarchical vs Hybrid on shared memory, resnet50, 4 and 8 ranks
#   trace     the timeline's cost when on (gflow_traced / gflow, resnet50 and resnet20) and the
#             ResNet-50 overlap trace on 4 ranks drawn into docs/timeline_resnet50_4.png
#   model     the alpha-beta fit + local work and its error at P = 2, 4, 8 (model_resnet50_<P>[_rN].jsonl)
#   autotune  overlap --autotune, resnet50 and gpt2_small, 4 ranks, compute ratios 0.5, 1, 2; then
#             resnet50 and resnet20 with --topology hybrid (the switch tuned too)
#   loops     the training-loop options: overlap --learn-order on shared_late (a tensor ready late)
#             and resnet50 (a control: its backward is the reverse order), 4 ranks; exchange --options
#             on resnet50 (4 ranks) and resnet20 (2 ranks); N repeats; docs/learn_order.png
# Run it alone on the machine: a compile or a test beside it makes the numbers worthless.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/docs/results"
repeats=3
sections=()
while (($#)); do
  case "$1" in
    --repeats) repeats="$2"; shift 2 ;;
    exchange|wire|kernels|sparse|topology|trace|model|autotune|loops) sections+=("$1"); shift ;;
    *) echo "bench/measure.sh: unknown argument '$1' (sections: exchange wire kernels sparse topology trace model autotune loops; --repeats N)" >&2; exit 2 ;;
  esac
done
((${#sections[@]})) || { echo "usage: bench/measure.sh exchange|wire|kernels|sparse|topology|trace|model|autotune|loops... [--repeats N]" >&2; exit 2; }
run() {  # run OUTFILE ARGS...: one bench/run invocation, progress on stderr
  local f="$1"; shift
  printf '[%s] bench/run %s > %s\n' "$(date +%T)" "$*" "${f#$root/}" >&2
  "$root/bench/run" "$@" > "$f"
}
for s in "${sections[@]}"; do
  case "$s" in
    exchange)
      for r in $(seq 1 "$repeats"); do  # repeats interleaved across configurations
        for l in resnet50 gpt2_small resnet20; do
          for p in 2 4; do
            suffix=""; ((r > 1)) && suffix="_r$r"
            run "$out/ex_${l}_${p}${suffix}.jsonl" exchange --layout "$l" --ranks "$p"
          done
        done
      done ;;
    wire)
      for r in $(seq 1 "$repeats"); do
        for w in fp16 bf16; do
          suffix=""; ((r > 1)) && suffix="_r$r"
          run "$out/ex_resnet50_4_${w}${suffix}.jsonl" exchange --layout resnet50 --ranks 4 --wire "$w"
        done
      done ;;
    kernels)
      run "$out/kernels.jsonl" kernels --layout resnet50,gpt2_small ;;
    sparse)
      for l in resnet50 alexnet gpt2_small; do
        for p in 2 4 8; do run "$out/sp_${l}_mpi_${p}.jsonl" sparse --layout "$l" --ranks "$p" --quick; done
        for p in 2 4; do run "$out/sp_${l}_inproc_${p}.jsonl" sparse --layout "$l" --ranks "$p" --transport inproc --quick; done
      done
      run "$out/sp_resnet50_inproc_8.jsonl" sparse --layout resnet50 --ranks 8 --transport inproc --quick ;;
    topology)
      for p in 4 8; do run "$out/topo_resnet50_${p}.jsonl" exchange --layout resnet50 --ranks "$p" --topology all --quick; done ;;
    trace)
      for r in $(seq 1 "$repeats"); do
        run "$out/trace_cost_resnet20_2_r$r.jsonl" exchange --layout resnet20 --ranks 2 --iters 200 --warmup 10 --trace "$out/trace_exchange_resnet20_2.json"
        run "$out/trace_cost_resnet50_4_r$r.jsonl" exchange --layout resnet50 --ranks 4 --quick --trace "$out/trace_exchange_resnet50_4.json"
      done
      run "$out/trace_overlap_resnet50_4.jsonl" overlap --layout resnet50 --ranks 4 --quick --compute-ratio 1 --trace "$out/trace_overlap_resnet50_4.json"
      python3 "$root/bench/plot.py" trace "$out/trace_overlap_resnet50_4.json" -o "$root/docs/timeline_resnet50_4.png" ;;
    model)
      for r in $(seq 1 "$repeats"); do  # the check compares medians over repeats (docs/BENCHMARKS.md)
        for p in 2 4 8; do
          suffix=""; ((r > 1)) && suffix="_r$r"
          run "$out/model_resnet50_${p}${suffix}.jsonl" model --layout resnet50 --ranks "$p" --reps 15 --iters 15
        done
      done
      python3 "$root/bench/plot.py" model "$out"/model_resnet50_[248].jsonl -o "$root/docs/cost_model.png" ;;
    autotune)
      for l in resnet50 gpt2_small; do
        run "$out/autotune_${l}_4.jsonl" overlap --layout "$l" --ranks 4 --autotune --compute-ratio 0.5,1,2
      done
      for l in resnet50 resnet20; do
        run "$out/autotune_hybrid_${l}_4.jsonl" overlap --layout "$l" --ranks 4 --autotune --topology hybrid --compute-ratio 0.5,1,2
      done
      python3 "$root/bench/plot.py" autotune "$out"/autotune_*_4.jsonl ;;
    loops)
      for r in $(seq 1 "$repeats"); do
        for l in shared_late resnet50; do run "$out/loops_overlap_${l}_4_r$r.jsonl" overlap --layout "$l" --ranks 4 --learn-order; done
        run "$out/loops_options_resnet50_4_r$r.jsonl" exchange --layout resnet50 --ranks 4 --options
        run "$out/loops_options_resnet20_2_r$r.jsonl" exchange --layout resnet20 --ranks 2 --options
      done
      python3 "$root/bench/plot.py" loops "$out"/loops_*.jsonl -o "$root/docs/learn_order.png" ;;
  esac
done
echo "[$(date +%T)] done" >&2
