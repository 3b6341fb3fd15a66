#!/usr/bin/env bash
# scripts/gpu-bundle.sh BUILD_DIR [OUT_DIR]: what a lent GPU machine needs to run the CUDA checks
# without building (scripts/gpu-check.sh with GFLOW_GPU_PREBUILT=OUT_DIR), collected from a build
# made here (cmake -DGFLOW_CUDA_ARCHITECTURES=90 ...; the targets below):
#   OUT_DIR/gflow_cuda_tests, OUT_DIR/gflow_cuda_mpi_tests, OUT_DIR/bench/gflow_bench_device,
#   OUT_DIR/bench/gflow_bench_exchange_device, OUT_DIR/COMMIT (the commit they were built at),
#   OUT_DIR/lib/      libcudart and every shared library the binaries and Open MPI need that is
#                     not the C/C++ runtime (the lent machine has no Open MPI, hwloc, PMIx, ...),
#   OUT_DIR/mpi/usr/  this machine's Open MPI runtime (orterun, orted, plugins, PMIx and help
#                     files) in Debian's layout, which Open MPI relocates to wherever it lies
#                     through OPAL_PREFIX (PMIx through PMIX_INSTALL_PREFIX): gpu-check.sh sets both,
#   OUT_DIR/python/   gflow.torch (BUILD_DIR/python/gflow: the package with libgflow_capi_cuda.so),
#                     the C++ reference writer (gflow_python_reference), pytest and what it imports
#                     (site/, pure Python, from a Python 3 here that has it: GFLOW_BUNDLE_PYTHON), and
#                     a Fashion-MNIST subset for train.py --device cuda (data/: the first 6400
#                     training and 2000 test images).
# Every binary is stripped (--strip-unneeded): the device tool carries at most 64 MiB.
# OUT_DIR defaults to .gpu in the repository root (ignored by git through .git/info/exclude; name it
# in the device tool's carry). About 30 MB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:?usage: gpu-bundle.sh BUILD_DIR [OUT_DIR]}"
out="${2:-$root/.gpu}"
rm -rf "$out"
mkdir -p "$out/bench" "$out/lib" "$out/mpi/usr/bin" "$out/mpi/usr/lib/x86_64-linux-gnu" "$out/mpi/usr/share"
cp "$build/tests/cuda/gflow_cuda_tests" "$out/"
[[ -f "$build/tests/cuda/gflow_cuda_mpi_tests" ]] && cp "$build/tests/cuda/gflow_cuda_mpi_tests" "$out/"
for b in gflow_bench_device gflow_bench_exchange_device; do
  [[ -f "$build/bench/$b" ]] && cp "$build/bench/$b" "$out/bench/"
done
if [[ -f "$build/python/gflow/libgflow_capi_cuda.so" ]]; then
  mkdir -p "$out/python/site" "$out/python/data"
  cp -a "$build/python/gflow" "$out/python/"
  rm -f "$out/python/gflow/libgflow_capi.so"  # the CUDA library holds the host menu too
  [[ -f "$build/tests/python/gflow_python_reference" ]] && cp "$build/tests/python/gflow_python_reference" "$out/python/"
  py="${GFLOW_BUNDLE_PYTHON:-python3}"
  site="$("$py" -c 'import os, pytest; print(os.path.dirname(os.path.dirname(pytest.__file__)))' 2>/dev/null || true)"
  if [[ -n "$site" ]]; then
    # exceptiongroup and tomli: what pytest needs on Python < 3.11
    for m in pytest _pytest pluggy iniconfig packaging pygments exceptiongroup tomli py.py; do
      [[ -e "$site/$m" ]] && cp -a "$site/$m" "$out/python/site/"
    done
    # pygments without the lexers pytest does not import (9.5 MB of 11): it colours only python and diff output
    find "$out/python/site/pygments/lexers" -mindepth 1 -maxdepth 1 ! -name __init__.py ! -name _mapping.py ! -name python.py ! -name diff.py \
      -exec rm -rf {} + 2>/dev/null || true
    find "$out/python/site" -name __pycache__ -prune -exec rm -rf {} +
  else
    echo "gpu-bundle: no pytest in $py: the gflow.torch CUDA tests will need the GPU machine's own" >&2
  fi
  "$py" - "$out/python/data" <<'PYEOF' || echo "gpu-bundle: no Fashion-MNIST subset (dataset-fashion-mnist missing?)" >&2
import gzip, os, sys
src, dst = "/usr/share/datasets/fashion-mnist", sys.argv[1]
def cut(name, header, count, item):
    with gzip.open(os.path.join(src, name), "rb") as f:
        b = f.read()
    n = min(count, int.from_bytes(b[4:8], "big"))
    out = b[:4] + n.to_bytes(4, "big") + b[8:header] + b[header:header + n * item]
    with gzip.open(os.path.join(dst, name), "wb") as f:
        f.write(out)
cut("train-images-idx3-ubyte.gz", 16, 6400, 784)
cut("train-labels-idx1-ubyte.gz", 8, 6400, 1)
cut("t10k-images-idx3-ubyte.gz", 16, 2000, 784)
cut("t10k-labels-idx1-ubyte.gz", 8, 2000, 1)
PYEOF
fi
find "$out" -maxdepth 3 -type f \( -name 'gflow_*' -o -name 'libgflow_capi*.so' \) -exec strip --strip-unneeded {} + || echo "gpu-bundle: strip failed; the bundle keeps its symbols" >&2
git -C "$root" rev-parse --short HEAD > "$out/COMMIT"
if ! git -C "$root" diff --quiet HEAD -- include tests bench python 2>/dev/null; then echo "+uncommitted" >> "$out/COMMIT"; fi

# Open MPI's runtime, where this machine has Debian's.
ompi=/usr/lib/x86_64-linux-gnu/openmpi
if [[ -d "$ompi" ]] && command -v orterun >/dev/null; then
  cp "$(command -v orterun)" "$(command -v orted)" "$out/mpi/usr/bin/"
  ln -s orterun "$out/mpi/usr/bin/mpiexec"
  cp -a "$ompi" "$out/mpi/usr/lib/x86_64-linux-gnu/"
  rm -rf "$out/mpi/usr/lib/x86_64-linux-gnu/openmpi/include"  # headers: the binaries are built
  [[ -d /usr/lib/x86_64-linux-gnu/pmix2 ]] && cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$out/mpi/usr/lib/x86_64-linux-gnu/"
  for d in openmpi pmix; do [[ -d /usr/share/$d ]] && cp -a "/usr/share/$d" "$out/mpi/usr/share/"; done
fi

# Every shared library the binaries and the MPI runtime load, but the C and C++ runtimes (the lent
# machine's own are newer), the driver (libcuda comes with the GPU) and NCCL (over 200 MB; the lent
# machine has it in Python's nvidia-nccl-cu13 package, where gpu-check.sh finds it).
skip='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libnccl)\.so'
mapfile -t objs < <(find "$out" -type f \( -name '*.so*' -o -perm -u+x \) ! -name COMMIT ! -path "$out/python/site/*")
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
done
du -sh "$out" | awk '{print "gpu-bundle: " $1 " in " $2}'
