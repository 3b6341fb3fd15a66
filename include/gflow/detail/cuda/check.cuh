#pragma once
// CUDA runtime error checking and a scoped current-device switch.
//
// Host code only (no kernels): it compiles with nvcc and with a plain host compiler that has
// the CUDA include directory on its path, so the NCCL transport (a .hpp) uses it too.
//
//   gflow::detail::cuda::check_cuda(cudaMalloc(&p, bytes), "cudaMalloc of the gradient pool");
//
// A failed call raises gflow::transport_error with subject "cuda"; the message names the call,
// CUDA's error name and text, and a fix chosen from the error code.
#include <cuda_runtime_api.h>

#include <string>

#include "../../error.hpp"

namespace gflow::detail::cuda {

/// What to do about a CUDA error, by code. Errors raised by an earlier kernel (they are sticky
/// and come back from the next call) get the compute-sanitizer hint.
inline const char* cuda_fix(cudaError_t e) noexcept {
  switch (e) {
    case cudaErrorNoDevice:
      return "run on a machine with a CUDA device (check nvidia-smi and CUDA_VISIBLE_DEVICES).";
    case cudaErrorInsufficientDriver:
      return "install an NVIDIA driver at least as new as the CUDA toolkit gflow was compiled with.";
    case cudaErrorInvalidDevice:
      return "pass a device index in [0, cudaGetDeviceCount()).";
    case cudaErrorMemoryAllocation:
      return "free device memory (other processes, caching allocators) or exchange a smaller layout per process.";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "compile for this GPU's architecture (set CMAKE_CUDA_ARCHITECTURES / nvcc -arch to include it).";
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return "pass device pointers and a stream that belong to the current device (cudaSetDevice(t.device()) "
             "before building the exchanger or calling the kernels).";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
      return "a kernel touched memory it does not own: check buffer sizes and that the pool views are used on "
             "the right device; run under compute-sanitizer to find the access. The CUDA context is now unusable.";
    default:
      return "check the CUDA installation and driver; run under compute-sanitizer to locate the failing call.";
  }
}

/// Throws gflow::transport_error("cuda", ...) when e is not cudaSuccess. `what` names the call
/// ("cudaMemcpyAsync of the non-finite counter").
inline void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::string msg = what;
  msg += " failed: ";
  msg += cudaGetErrorName(e);
  msg += " (";
  msg += cudaGetErrorString(e);
  msg += ").";
  throw transport_error("cuda", msg, cuda_fix(e));
}
inline void check_cuda(cudaError_t e, const std::string& what) { check_cuda(e, what.c_str()); }

/// Makes `device` current for the guard's lifetime and restores the previous device after.
/// Cheap when the device is already current (no cudaSetDevice call).
class device_guard {
 public:
  explicit device_guard(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device != prev_) {
      const cudaError_t e = cudaSetDevice(device);
      if (e != cudaSuccess) check_cuda(e, fmt::format("cudaSetDevice({})", device));
      switched_ = true;
    }
  }
  ~device_guard() {
    if (switched_) (void)cudaSetDevice(prev_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

}  // namespace gflow::detail::cuda
