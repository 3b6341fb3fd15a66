#pragma once
// gflow::mpi_device::transport: the exchanger on device memory across separate processes over
// MPI, one CUDA device per rank (several ranks may share one GPU, which NCCL refuses).
//
//   gflow::mpi::environment env(argc, argv);
//   gflow::mpi_device::transport t(MPI_COMM_WORLD, gflow::mpi_device::local_device(MPI_COMM_WORLD));
//   gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.01>>>::on<gflow::mpi_device::transport> ex(t, layout);
//   ...   // buffers are device pointers of t.device(); kernels run on t.stream()
//
// memory_space is device_memory. Each collective waits for the rank's stream, then runs
// gflow::mpi::transport's collective (transport/mpi.hpp: the same MPI calls, the same argument
// checks, typed errors and timeouts) on page-locked host copies and copies the result up on the
// rank's stream before returning (transport/staged_device.cuh, shared with
// gflow::inproc_device::transport); the i-forms complete before they return. So a device exchange
// over this transport gives the bytes a host exchange over gflow::mpi::transport gives on the same
// gradients (tests/cuda/test_mpi_device.cu checks it under mpiexec, and against
// gflow::inproc_device where MPI's reduction order is the in-process one).
//
// Where the MPI reports that it is CUDA-aware (Open MPI's MPIX_Query_cuda_support()), the
// default path hands it the device pointers instead, with no staging; path::staged forces the
// staging buffers, path::direct refuses an MPI that does not report CUDA support. The direct path
// has not run yet: no CUDA-aware MPI has been available to this project (Debian's Open MPI is not).
//
// Constructing one (and split) is a collective over the communicator, as for gflow::mpi::transport.
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#include <cuda_runtime.h>

#include <chrono>
#include <utility>

#include "../error.hpp"
#include "../transport/mpi.hpp"
#include "../transport/transport.hpp"
#include "../detail/cuda/check.cuh"
#include "../transport/staged_device.cuh"

namespace gflow::mpi_device {

/// How the data reaches MPI: automatic (direct when the MPI is CUDA-aware, else staged), through
/// page-locked host buffers, or device pointers straight to MPI.
enum class path { automatic, staged, direct };

/// True when this MPI says at run time that it reads and writes CUDA device memory (Open MPI's
/// MPIX_Query_cuda_support(); false for an MPI that has no such query).
inline bool cuda_aware_mpi() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

/// This process's rank among the ranks of `comm` on the same node, modulo the visible CUDA
/// devices: the device a rank should use when each node's ranks share its GPUs round-robin.
/// Collective over comm.
inline int local_device(MPI_Comm comm) {
  const int local = gflow::mpi::node_rank(comm).rank;
  int devices = 0;
  gflow::detail::cuda::check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount in gflow::mpi_device::local_device");
  if (devices <= 0)
    throw usage_error("device", "no CUDA device is visible to this process.",
                      "run on a machine with a GPU (check CUDA_VISIBLE_DEVICES), or use gflow::mpi::transport on host memory.");
  return local % devices;
}

class transport : public gflow::detail::cuda::staged_transport<gflow::mpi::transport, transport> {
  using base = gflow::detail::cuda::staged_transport<gflow::mpi::transport, transport>;

 public:
  /// Rank of `comm` on CUDA device `device` with a new non-blocking stream; every blocking wait
  /// bounded by `timeout` (0: none), as gflow::mpi::transport. Collective over comm.
  transport(MPI_Comm comm, int device, std::chrono::milliseconds timeout = gflow::mpi::default_timeout, path p = path::automatic)
      : transport(gflow::mpi::transport(comm, timeout), device, p) {}
  /// The same over an existing host transport (its communicator, timeout and state are shared).
  transport(gflow::mpi::transport host, int device, path p = path::automatic)
      : base(std::move(host), checked_device(device), choose(p), true) {}

  [[nodiscard]] MPI_Comm comm() const { return host().comm(); }
  /// Bounds every later blocking wait (0: no timeout), as gflow::mpi::transport::set_timeout.
  void set_timeout(std::chrono::milliseconds t) { host().set_timeout(t); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return host().timeout(); }

 private:
  friend base;
  // split(): the sub-group on the same device, path and stream.
  transport(gflow::mpi::transport host, int device, typename base::split_tag s) : base(std::move(host), device, std::move(s)) {}

  static int checked_device(int device) {
    int devices = 0;
    gflow::detail::cuda::check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount for gflow::mpi_device::transport");
    if (device < 0 || device >= devices)
      throw invalid_argument("device", fmt::format("CUDA device {} does not exist; this process sees {} device(s).", device, devices),
                             "pass a device in [0, cudaGetDeviceCount()), e.g. gflow::mpi_device::local_device(comm).");
    return device;
  }
  static bool choose(path p) {
    const bool aware = cuda_aware_mpi();
    if (p == path::direct && !aware)
      throw usage_error("path", "path::direct needs an MPI that reads device memory, and this MPI does not report CUDA support "
                                "(MPIX_Query_cuda_support).",
                        "use path::automatic or path::staged, or run with a CUDA-aware MPI build.");
    return p == path::direct || (p == path::automatic && aware);
  }
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport> && gflow::sharding_transport<transport>);

}  // namespace gflow::mpi_device
