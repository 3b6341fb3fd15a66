#!/usr/bin/env bash
# bench/ddp_gloo.sh [--layout resnet50] [--ranks 4] [--repeats 3] [--iters 15] [--out DIR]
# gflow's exchange against PyTorch's over gloo on the same buckets, in one run: repeats of
# `bench/run exchange` (gflow, hand-written bucketed MPI) and bench/ddp_gloo.py (gloo_bucketed,
# ddp_backward, local_backward) alternate, the order flipped every repeat, and the ratio
# gflow / gloo_bucketed is printed per repeat and as the median of the repeats. Needs
# /usr/bin/python3 with torch (Debian's python3-torch). Raw JSON lines go to DIR (default: a
# temporary directory) as gflow_rN.jsonl and gloo_rN.jsonl.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layout=resnet50 ranks=4 repeats=3 iters=15 out=""
while (($#)); do
  case "$1" in
    --layout) layout="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench/ddp_gloo.sh: unknown argument '$1' (--layout NAME --ranks N --repeats R --iters I --out DIR)" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-/usr/bin/python3}"
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "bench/ddp_gloo.sh: $py cannot import torch.distributed (apt-get install python3-torch)" >&2; exit 2; }
[[ -n "$out" ]] || out="$(mktemp -d)"
mkdir -p "$out"
mpi_flags=(--oversubscribe --bind-to none)
if [[ "$(id -u)" == 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
gflow_run() { "$root/bench/run" exchange --layout "$layout" --ranks "$ranks" --iters "$iters" --warmup 3 > "$out/gflow_r$1.jsonl"; }
gloo_run() { mpiexec "${mpi_flags[@]}" -n "$ranks" "$py" "$root/bench/ddp_gloo.py" --layout "$layout" --iters "$iters" --warmup 3 --port $((29500 + $1)) > "$out/gloo_r$1.jsonl"; }
for ((r = 1; r <= repeats; r++)); do
  echo "bench/ddp_gloo.sh: repeat $r/$repeats ($layout, $ranks ranks)" >&2
  if ((r % 2)); then gflow_run "$r"; gloo_run "$r"; else gloo_run "$r"; gflow_run "$r"; fi
done
"$py" - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def med(path, variant):
    for line in open(path):
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("variant") == variant:
                return j["median_s"]
    sys.exit(f"bench/ddp_gloo.sh: {path} has no variant {variant}")
rows = []
print(f"{'repeat':>6} {'gflow ms':>9} {'mpi_bucketed ms':>15} {'gloo_bucketed ms':>16} {'ddp added ms':>12} {'gflow/gloo':>10}")
for r in range(1, repeats + 1):
    g, m = med(f"{out}/gflow_r{r}.jsonl", "gflow"), med(f"{out}/gflow_r{r}.jsonl", "mpi_bucketed")
    gl = med(f"{out}/gloo_r{r}.jsonl", "gloo_bucketed")
    added = med(f"{out}/gloo_r{r}.jsonl", "ddp_backward") - med(f"{out}/gloo_r{r}.jsonl", "local_backward")
    rows.append(g / gl)
    print(f"{r:>6} {g*1e3:>9.2f} {m*1e3:>15.2f} {gl*1e3:>16.2f} {added*1e3:>12.2f} {g/gl:>10.3f}")
print(f"gflow / gloo_bucketed: median {statistics.median(rows):.3f}, range {min(rows):.3f}-{max(rows):.3f} over {repeats} repeats (raw files in {out})")
PY
