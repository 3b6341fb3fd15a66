#!/usr/bin/env bash
# bench/python_vs_cpp.sh [--ranks 4] [--repeats 3] [--train-limit 12000] [--build DIR] [--out DIR]
# The Python front end's speed, in one run: the libtorch C++ trainer (examples/torch, one binary per
# composition), examples/python/train.py (gflow.torch) with the same composition, and
# bench/python_ddp.py (the same model under torch DDP over gloo, the same buckets as
# "fusion=25MiB,first=1MiB"), one epoch on --train-limit samples each, alternating run by run, the
# order flipped every repeat. Prints ms/iteration per run and the ratios Python / C++ and
# gflow.torch / DDP per repeat and as the median over repeats. Every run's RESULT line goes to
# DIR/runs.txt (default DIR: a temporary directory), after a line "==> NAME <==" that names the run
# (cpp_torch_dense_r1.txt, py_torch_topk_r2.txt, ddp_r1.txt, ...). Needs the build's torch_* trainers and
# gflow_python module (cmake --build DIR --target gflow_python torch_dense torch_topk torch_fp16).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ranks=4 repeats=3 limit=12000 build="$root/build" out=""
while (($#)); do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --train-limit) limit="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench/python_vs_cpp.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-/usr/bin/python3}"
[[ -n "$out" ]] || out="$(mktemp -d)"
mkdir -p "$out"
work="$(mktemp -d)"  # a file per run while they run, and the runs' stderr (stderr.log)
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" OMPI_MCA_rmaps_base_oversubscribe=1
mpi=(mpiexec --bind-to none -n "$ranks")
if [[ "$(id -u)" == 0 ]]; then mpi+=(--allow-run-as-root); fi
common=(--epochs 1 --train-limit "$limit" --seed 1)
# pairs: python composition name, C++ trainer binary
pairs=("dense torch_dense" "topk=0.01 torch_topk" "fp16 torch_fp16")
run() {  # run NAME CMD...: the RESULT line into $work/NAME
  local f="$work/$1"; shift
  echo "[$(date +%T)] $*" >&2
  "$@" 2>>"$work/stderr.log" | grep '^RESULT' > "$f" || { echo "bench/python_vs_cpp.sh: no RESULT from: $* (stderr: $work/stderr.log)" >&2; exit 1; }
}
for ((r = 1; r <= repeats; r++)); do
  for pair in "${pairs[@]}"; do
    read -r comp bin <<< "$pair"
    c=(run "cpp_${bin}_r$r.txt" "${mpi[@]}" "$build/examples/$bin" "${common[@]}")
    p=(run "py_${bin}_r$r.txt" "${mpi[@]}" "$py" "$root/examples/python/train.py" --composition "$comp" "${common[@]}")
    if ((r % 2)); then "${c[@]}"; "${p[@]}"; else "${p[@]}"; "${c[@]}"; fi
  done
  d=(run "ddp_r$r.txt" "${mpi[@]}" "$py" "$root/bench/python_ddp.py" --bucket-mb 25 --first-bucket-mb 1 "${common[@]}")
  g=(run "py_fusion25_r$r.txt" "${mpi[@]}" "$py" "$root/examples/python/train.py" --composition "fusion=25MiB,first=1MiB" "${common[@]}")
  if ((r % 2)); then "${d[@]}"; "${g[@]}"; else "${g[@]}"; "${d[@]}"; fi
done
for f in "$work"/*_r*.txt; do printf '==> %s <==\n' "${f##*/}"; cat "$f"; done > "$out/runs.txt"
"$py" - "$out/runs.txt" "$repeats" <<'PY'
import re, statistics, sys
path, repeats = sys.argv[1], int(sys.argv[2])
runs, name = {}, None  # run name -> its RESULT line(s)
for line in open(path):
    m = re.match(r"==> (.+) <==$", line.rstrip("\n"))
    if m:
        name = m.group(1)
        runs[name] = ""
    else:
        runs[name] += line
def ms(name):
    m = re.search(r"ms_per_iter=([0-9.]+)", runs[name])
    return float(m.group(1))
print("| composition | C++ ms/iter (runs) | Python ms/iter (runs) | Python / C++ per repeat | median |")
print("| --- | --- | --- | --- | ---: |")
for b in ["torch_dense", "torch_topk", "torch_fp16"]:
    c = [ms(f"cpp_{b}_r{r}.txt") for r in range(1, repeats + 1)]
    p = [ms(f"py_{b}_r{r}.txt") for r in range(1, repeats + 1)]
    q = [y / x for x, y in zip(c, p)]
    print(f"| {b[6:]} | {', '.join(f'{x:.1f}' for x in c)} | {', '.join(f'{x:.1f}' for x in p)} | {', '.join(f'{x:.3f}' for x in q)} | {statistics.median(q):.3f} |")
d = [ms(f"ddp_r{r}.txt") for r in range(1, repeats + 1)]
g = [ms(f"py_fusion25_r{r}.txt") for r in range(1, repeats + 1)]
q = [y / x for x, y in zip(d, g)]
print(f"| gflow.torch fusion=25MiB,first=1MiB vs DDP/gloo (25 MiB, first 1 MiB) | DDP {', '.join(f'{x:.1f}' for x in d)} | gflow {', '.join(f'{x:.1f}' for x in g)} | {', '.join(f'{x:.3f}' for x in q)} | {statistics.median(q):.3f} |")
print(f"(raw RESULT lines in {path})")
PY
