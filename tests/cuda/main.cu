// Runs the CUDA tests: `gflow_cuda_tests [suite [name]]` (suites: kernels, device, nccl; name: only the
// tests of the suite whose name contains it, e.g. one test on a short GPU lease).
// Exit codes: 0 passed, 1 failed, 77 skipped (ctest's SKIP_RETURN_CODE). Skipped only where there
// is genuinely no GPU: cudaGetDeviceCount says cudaErrorNoDevice (or 0 devices), or no NVIDIA
// driver is installed at all (libcuda.so.1 cannot be loaded: a machine without a GPU, where the
// runtime says cudaErrorInsufficientDriver). Any other error (a driver that is there but broken
// or too old, a runtime that cannot initialise) fails, with its text.
#include "harness_main.cuh"

int main(int argc, char** argv) {
  const int probed = gflow_cuda_test::probe_gpu();
  if (probed >= 0) return probed;
  return gflow_cuda_test::run_registered(argc > 1 ? argv[1] : nullptr, argc > 2 ? argv[2] : nullptr) ? 0 : 1;
}
