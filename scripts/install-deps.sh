#!/usr/bin/env bash
# Installs the Debian packages gflow's build, tests, benchmarks and demo need (idempotent:
# apt runs only when something is missing). The CUDA toolkit (nvcc, NCCL) is optional and is
# not installed here; when /usr/local/cuda/bin/nvcc exists the CUDA targets are built too.
set -euo pipefail
# libtorch-dev: libtorch 1.13's C++ API for the CNN trainer of examples/torch (optional to the
# build: CMake skips that trainer when it is missing).
# python3-torch, python3-numpy, python3-pytest: the tests of the Python front end gflow.torch
# (python/; its library, libgflow_capi.so, needs only MPI: it is loaded with ctypes);
# python3-mpi4py is not needed by gflow.torch (it initialises MPI itself) but coexists with it.
# libfmt-dev: {fmt}, the error texts (gflow::gflow links fmt::fmt).
# libsimgrid-dev: SimGrid's SMPI (smpicxx, smpirun): bench/simulate.sh's simulated clusters and the
# ctest sim_bitwise_16 (optional to the build: without it that test is not registered).
# libclang-rt-14-dev: libFuzzer and the sanitizer runtimes for clang (only recommended by clang-14).
pkgs=(cmake make g++ clang libclang-rt-14-dev libfmt-dev libopenmpi-dev openmpi-bin doctest-dev libeigen3-dev zlib1g-dev dataset-fashion-mnist libtorch-dev
      python3-torch python3-numpy python3-pytest libsimgrid-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
