#!/usr/bin/env bash
# A/B: base build vs new build, alternating. usage: ab.sh LAYOUT P ITERS REPEATS
L=$1; P=$2; IT=$3; R=$4
for r in $(seq 1 $R); do
  for v in base new; do
    if [ $v = base ]; then b=/work/wt-base/build-bench/bench/gflow_bench; else b=/work/main/build-bench/bench/gflow_bench; fi
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $P $b exchange --layout $L --iters $IT 2>/dev/null > /tmp/s5/ab_${L}_${P}_${v}_$r.jsonl
    python3 - "$v" "$r" /tmp/s5/ab_${L}_${P}_${v}_$r.jsonl <<'PY'
import sys,json
v,r,f=sys.argv[1:4]; rows=[json.loads(l) for l in open(f) if l.startswith('{')]
d={x['variant']:x for x in rows}
g=d.get('gflow',{}); u=d.get('gflow_untimed',{}); m=d.get('mpi_bucketed',{})
print(f"{v} r{r}: bucketed {m.get('median_s',0)*1e3:.3f} ms  gflow {g.get('median_s',0)*1e3:.3f} ({g.get('ratio_vs_mpi_bucketed',0):.3f})  untimed {u.get('median_s',0)*1e3:.3f} ({u.get('ratio_vs_mpi_bucketed',0):.3f})")
PY
  done
done
