#!/usr/bin/env bash
# timeline hooks (main) vs hooks compiled out (wt-nohooks): LAYOUT P ITERS REPEATS
L=$1; P=$2; IT=$3; R=$4
for r in $(seq 1 $R); do
  for v in hooks nohooks; do
    if [ $v = hooks ]; then b=/work/main/build-bench/bench/gflow_bench; else b=/work/wt-nohooks/build-bench/bench/gflow_bench; fi
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $P $b exchange --layout $L --iters $IT --warmup 100 2>/dev/null > /tmp/s5/tl_${L}_${P}_${v}_$r.jsonl
    python3 - "$v" "$r" /tmp/s5/tl_${L}_${P}_${v}_$r.jsonl <<'PY'
import sys,json
v,r,f=sys.argv[1:4]; rows=[json.loads(l) for l in open(f) if l.startswith('{')]
d={x['variant']:x for x in rows}
g=d['gflow']; u=d['gflow_untimed']; m=d['mpi_bucketed']
print(f"{v:8s} r{r}: bucketed {m['median_s']*1e6:8.1f} us  gflow {g['median_s']*1e6:8.1f} us ({g.get('ratio_vs_mpi_bucketed',0):.3f})  untimed {u['median_s']*1e6:8.1f} us ({u.get('ratio_vs_mpi_bucketed',0):.3f})")
PY
  done
done
