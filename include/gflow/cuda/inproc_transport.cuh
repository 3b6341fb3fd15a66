#pragma once
// gflow::inproc_device::transport: P ranks as P threads of one process on ONE GPU, each rank with
// its own CUDA stream. NCCL refuses several ranks on one device; this transport is what makes
// multi-rank tests of the exchanger's device path (device_backend, the sparse engines on device
// memory) possible on a machine with a single GPU. (Separate processes on one GPU:
// gflow::mpi_device::transport, <gflow/cuda/mpi_transport.cuh>.)
//
//   gflow::inproc_device::run(4, [&](gflow::inproc_device::transport& t) {
//     gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.01>>>::on<gflow::inproc_device::transport> ex(t, layout);
//     ...   // buffers are device pointers; kernels run on t.stream()
//   });
//
// memory_space is device_memory and every buffer is a device pointer of t.device(). Each
// collective waits for the rank's stream (the buffer is complete), then runs the in-process
// transport's collective (transport/inproc.hpp: the same matching, the same mismatch and timeout
// errors, reductions adding ranks 0..P-1 in order in fp32 and rounding once) on pageable host
// copies, and copies the result back before returning; the i-forms complete before they return
// (transport/staged_device.cuh, which gflow::mpi_device::transport shares with page-locked
// buffers). A sub-group made by split shares the rank's stream. The variable
// collectives (all_to_all, all_to_allv, all_gatherv: gflow::variable_transport) are staged the
// same way, with the host transport's count checks.
// The data path therefore crosses the host: this is a test transport (the reductions are those
// of the host in-process transport, so device exchanges can be compared bit for bit with host
// ones), not a fast one; NCCL is the production device transport.
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../transport/inproc.hpp"
#include "../transport/transport.hpp"
#include "../detail/cuda/check.cuh"
#include "../transport/staged_device.cuh"

namespace gflow::inproc_device {

class transport : public gflow::detail::cuda::staged_transport<inproc::transport, transport> {
  using base = gflow::detail::cuda::staged_transport<inproc::transport, transport>;

 public:
  /// Rank `host.rank()` of the group on CUDA device `device`, with a new non-blocking stream.
  /// Staged through pageable buffers, the path its bitwise tests have run on.
  transport(inproc::transport host, int device) : base(std::move(host), device, false, false) {}

 private:
  friend base;
  transport(inproc::transport host, int device, typename base::split_tag s) : base(std::move(host), device, std::move(s)) {}
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport> && gflow::sharding_transport<transport>);

/// Runs fn(transport&) on `ranks` threads, all on CUDA device `device`, one stream each, and
/// rethrows the first exception (lowest rank) after every thread has ended.
template <class Fn>
void run(int ranks, Fn&& fn, int device = 0, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  inproc::run(
      ranks,
      [&](inproc::transport& h) {
        gflow::detail::cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice for an in-process device rank");
        transport t(h, device);
        fn(t);
      },
      timeout);
}

}  // namespace gflow::inproc_device
