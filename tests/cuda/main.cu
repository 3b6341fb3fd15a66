// Runs the CUDA tests: `gflow_cuda_tests [suite [name]]` (suites: kernels, device, nccl; name: only the
// tests of the suite whose name contains it, e.g. one test on a short GPU lease).
// Exit codes: 0 passed, 1 failed, 77 skipped (ctest's SKIP_RETURN_CODE). Skipped only where there
// is genuinely no GPU: cudaGetDeviceCount says cudaErrorNoDevice (or 0 devices), or no NVIDIA
// driver is installed at all (libcuda.so.1 cannot be loaded: a machine without a GPU, where the
// runtime says cudaErrorInsufficientDriver). Any other error (a driver that is there but broken
// or too old, a runtime that cannot initialise) fails, with its text.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "harness.cuh"

namespace {
// True when the NVIDIA driver library is present (a GPU machine, working or not).
bool driver_installed() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  const char* suite = argc > 1 ? argv[1] : nullptr;
  const char* name = argc > 2 ? argv[2] : nullptr;
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && devices == 0)) {
    std::printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount reports 0");
    return 77;
  }
  if (e == cudaErrorInsufficientDriver && !driver_installed()) {
    std::printf("SKIPPED: no CUDA driver installed (libcuda.so.1 not found: %s)\n", cudaGetErrorString(e));
    return 77;
  }
  if (e != cudaSuccess) {
    std::printf("FAILED: cudaGetDeviceCount: %s (%s); a GPU machine whose driver or runtime fails is not skipped\n",
                cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
  }
  cudaDeviceProp prop{};
  const cudaError_t pe = cudaGetDeviceProperties(&prop, 0);
  if (pe != cudaSuccess) {
    std::printf("FAILED: cudaGetDeviceProperties(0): %s (%s)\n", cudaGetErrorName(pe), cudaGetErrorString(pe));
    return 1;
  }
  std::printf("%d CUDA device(s); device 0: %s (sm_%d%d)\n", devices, prop.name, prop.major, prop.minor);
  int ran = 0;
  for (const auto& t : gflow_cuda_test::registry()) {
    if (suite != nullptr && std::strcmp(suite, t.suite) != 0) continue;
    if (name != nullptr && std::strstr(t.name, name) == nullptr) continue;
    const int before = gflow_cuda_test::failures();
    std::printf("[ RUN  ] %s.%s\n", t.suite, t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& ex) {
      gflow_cuda_test::fail(t.name, 0, std::string("uncaught exception: ") + ex.what());
    }
    std::printf("[ %s ] %s.%s\n", gflow_cuda_test::failures() == before ? " OK " : "FAIL", t.suite, t.name);
    ++ran;
  }
  std::printf("%d test(s), %lld check(s), %d failure(s)\n", ran, static_cast<long long>(gflow_cuda_test::checks()),
              static_cast<int>(gflow_cuda_test::failures()));
  if (ran == 0) {
    std::printf("no test matches suite '%s'%s%s\n", suite ? suite : "", name ? " and name " : "", name ? name : "");
    return 1;
  }
  return gflow_cuda_test::failures() == 0 ? 0 : 1;
}
