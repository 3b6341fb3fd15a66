#pragma once
// What the CUDA test binaries' main functions share (main.cu; mpi_main.cu, one process per rank):
//   probe_gpu()                 -1 when a usable GPU is there, else the exit code: 77 (skipped) only
//                               where there is genuinely no GPU (cudaGetDeviceCount says
//                               cudaErrorNoDevice or 0 devices, or no NVIDIA driver is installed at
//                               all: libcuda.so.1 cannot be loaded), 1 for any other CUDA error (a
//                               driver that is there but broken or too old), with its text
//   run_registered(suite, name) runs the registered tests of `suite` (all when null) whose name
//                               contains `name` (all when null); prints each and a summary; true
//                               when at least one ran and none failed
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "harness.cuh"

namespace gflow_cuda_test {

// True when the NVIDIA driver library is present (a GPU machine, working or not).
inline bool driver_installed() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

inline int probe_gpu() {
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
  return -1;
}

inline bool run_registered(const char* suite, const char* name) {
  int ran = 0;
  for (const auto& t : registry()) {
    if (suite != nullptr && std::strcmp(suite, t.suite) != 0) continue;
    if (name != nullptr && std::strstr(t.name, name) == nullptr) continue;
    const int before = failures();
    std::printf("[ RUN  ] %s.%s\n", t.suite, t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& ex) {
      fail(t.name, 0, std::string("uncaught exception: ") + ex.what());
    }
    std::printf("[ %s ] %s.%s\n", failures() == before ? " OK " : "FAIL", t.suite, t.name);
    ++ran;
  }
  std::printf("%d test(s), %lld check(s), %d failure(s)\n", ran, static_cast<long long>(checks()), static_cast<int>(failures()));
  if (ran == 0) {
    std::printf("no test matches suite '%s'%s%s\n", suite ? suite : "", name ? " and name " : "", name ? name : "");
    return false;
  }
  return failures() == 0;
}

}  // namespace gflow_cuda_test
