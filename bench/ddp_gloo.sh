#!/usr/bin/env bash
# bench/ddp_gloo.sh [--layout resnet50] [--ranks 4] [--repeats 3] [--iters 15] [--fast N] [--out DIR]
# gflow's exchange against PyTorch's over gloo on the same buckets, in one run: repeats of
# `bench/run exchange` (gflow, hand-written bucketed MPI) and bench/ddp_gloo.py (gloo_bucketed,
# ddp_backward, local_backward) alternate, the order flipped every repeat, and the ratio
# gflow / gloo_bucketed is printed per repeat and as the median of the repeats. Needs
# /usr/bin/python3 with torch (Debian's python3-torch). Raw JSON lines go to DIR (default: a
# temporary directory) as gflow.jsonl and gloo.jsonl (replaced), repeat N's rows beginning {"run":N,.
#
# Machine levels: on the 2-vCPU machines this project measures on, a 2-rank shared-memory exchange
# runs at one of two levels about 2x apart (resnet50: ~25 or ~57 ms), gflow and the hand-written
# MPI loop alike within a run, whatever the binding (--bind-to none / core) or Open MPI's
# single-copy mechanism (docs/BENCHMARKS.md, "Two machine levels"). Each repeat is therefore
# classified by its own hand-written loop: "fast" when its mpi_bucketed time is within 1.5x of the
# fastest repeat's, "slow" otherwise. --fast N repeats (at most repeats + 3N times in all) until N
# repeats ran on the fast level, and the summary gives the spread over all repeats and over the
# fast ones.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layout=resnet50 ranks=4 repeats=3 iters=15 fast=0 out=""
while (($#)); do
  case "$1" in
    --layout) layout="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --fast) fast="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench/ddp_gloo.sh: unknown argument '$1' (--layout NAME --ranks N --repeats R --iters I --fast N --out DIR)" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-/usr/bin/python3}"
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "bench/ddp_gloo.sh: $py cannot import torch.distributed (apt-get install python3-torch)" >&2; exit 2; }
[[ -n "$out" ]] || out="$(mktemp -d)"
mkdir -p "$out"
: > "$out/gflow.jsonl"
: > "$out/gloo.jsonl"
mpi_flags=(--oversubscribe --bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
gflow_run() { "$root/bench/run" exchange --layout "$layout" --ranks "$ranks" --iters "$iters" --warmup 3 | sed "s/^{/{\"run\":$1,/" >> "$out/gflow.jsonl"; }
gloo_run() { mpiexec "${mpi_flags[@]}" -n "$ranks" "$py" "$root/bench/ddp_gloo.py" --layout "$layout" --iters "$iters" --warmup 3 --port $((29500 + $1)) | sed "s/^{/{\"run\":$1,/" >> "$out/gloo.jsonl"; }
# analyse MODE R, over repeats 1..R: "count" prints how many ran on the fast level (their
# mpi_bucketed within FAST_WITHIN of the fastest repeat's), "summary" prints the table and spreads.
analyse() {
  "$py" - "$out" "$2" "$1" <<'PY'
import json, statistics, sys
out, repeats, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
FAST_WITHIN = 1.5
def med(kind, r, variant):  # repeat r's median of variant in gflow.jsonl or gloo.jsonl
    for line in open(f"{out}/{kind}.jsonl"):
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("run") == r and j.get("variant") == variant:
                return j["median_s"]
    sys.exit(f"bench/ddp_gloo.sh: {out}/{kind}.jsonl has no variant {variant} in repeat {r}")
hand = [med("gflow", r, "mpi_bucketed") for r in range(1, repeats + 1)]
fast = [m <= FAST_WITHIN * min(hand) for m in hand]
if mode == "count":
    print(sum(fast))
    sys.exit()
runs = []
for r in range(1, repeats + 1):
    g, m = med("gflow", r, "gflow"), hand[r - 1]
    gl = med("gloo", r, "gloo_bucketed")
    added = med("gloo", r, "ddp_backward") - med("gloo", r, "local_backward")
    runs.append((r, g, m, gl, added))
print(f"{'repeat':>6} {'level':>5} {'gflow ms':>9} {'mpi_bucketed ms':>15} {'gloo_bucketed ms':>16} {'ddp added ms':>12} {'gflow/gloo':>10}")
for (r, g, m, gl, added), f in zip(runs, fast):
    print(f"{r:>6} {'fast' if f else 'slow':>5} {g*1e3:>9.2f} {m*1e3:>15.2f} {gl*1e3:>16.2f} {added*1e3:>12.2f} {g/gl:>10.3f}")
def summary(name, sel):
    if not sel:
        print(f"{name}: no repeat"); return
    gs = [x[1] for x in sel]; ratios = [x[1] / x[3] for x in sel]; mg = statistics.median(gs)
    print(f"{name} ({len(sel)} repeats): gflow median {mg*1e3:.2f} ms, spread {100*(min(gs)/mg-1):+.0f}% / {100*(max(gs)/mg-1):+.0f}%; "
          f"gflow / gloo_bucketed median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
summary("all repeats", runs)
summary("fast level", [x for x, f in zip(runs, fast) if f])
print(f"(raw files in {out})")
PY
}
r=0
while :; do
  r=$((r + 1))
  echo "bench/ddp_gloo.sh: repeat $r ($layout, $ranks ranks; $repeats repeats, then until $fast on the fast level)" >&2
  if ((r % 2)); then gflow_run "$r"; gloo_run "$r"; else gloo_run "$r"; gflow_run "$r"; fi
  if ((r >= repeats)) && { ((fast == 0)) || (($(analyse count "$r") >= fast)) || ((r >= repeats + 3 * fast)); }; then break; fi
done
analyse summary "$r"
