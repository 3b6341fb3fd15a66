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
#                     through OPAL_PREFIX (PMIx through PMIX_INSTALL_PREFIX): gpu-check.sh sets both.
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
git -C "$root" rev-parse --short HEAD > "$out/COMMIT"
if ! git -C "$root" diff --quiet HEAD -- include tests bench 2>/dev/null; then echo "+uncommitted" >> "$out/COMMIT"; fi

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
mapfile -t objs < <(find "$out" -type f \( -name '*.so*' -o -perm -u+x \) ! -name COMMIT)
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
done
du -sh "$out" | awk '{print "gpu-bundle: " $1 " in " $2}'
