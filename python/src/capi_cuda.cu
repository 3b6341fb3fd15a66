// libgflow_capi_cuda.so's device world: the device transport every device exchanger of the
// process runs on, created by gflow_device_init (capi.cpp) through python::device_support.
//
// The choice ("auto"): NCCL when no two ranks of a node share a GPU (compared by PCI bus id, so
// per-rank CUDA_VISIBLE_DEVICES settings are seen through), else gflow::mpi_device::transport,
// which stages through page-locked host buffers (or hands device pointers to a CUDA-aware MPI).
// "nccl" with two ranks on one GPU is refused on every rank (usage_error naming the ranks), since
// NCCL would fail or hang in ncclCommInitRank. The NCCL id goes from rank 0 to the others over MPI.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gflow/cuda/mpi_transport.cuh>
#include <gflow/transport/nccl.hpp>  // the CUDA library is built only where NCCL is (python/CMakeLists.txt)

#include "port.hpp"

namespace gflow::python {
namespace {

// This process's GPU as a string that names it across processes of one node.
std::string bus_id(int device) {
  char id[32] = {};
  gflow::detail::cuda::check_cuda(cudaDeviceGetPCIBusId(id, sizeof id, device), "cudaDeviceGetPCIBusId in gflow_device_init");
  return id;
}

// The world ranks (in pairs) that share a GPU with another rank of their node; empty when none.
// Collective over world.
std::vector<int> shared_gpus(mpi::transport& world, int device) {
  MPI_Comm node = MPI_COMM_NULL;
  mpi::detail::check(MPI_Comm_split_type(world.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type", "in gflow_device_init");
  struct entry {
    char bus[32];
    int world_rank;
  };
  entry mine{};
  const std::string b = bus_id(device);
  std::strncpy(mine.bus, b.c_str(), sizeof mine.bus - 1);
  mine.world_rank = world.rank();
  int n = 0;
  MPI_Comm_size(node, &n);
  std::vector<entry> all(static_cast<std::size_t>(n));
  const int rc = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, node);
  MPI_Comm_free(&node);
  mpi::detail::check(rc, "MPI_Allgather", "of the GPUs' bus ids in gflow_device_init");
  std::vector<int> out;
  for (std::size_t i = 0; i < all.size() && out.empty(); ++i)
    for (std::size_t j = i + 1; j < all.size() && out.empty(); ++j)
      if (std::strcmp(all[i].bus, all[j].bus) == 0) out = {all[i].world_rank, all[j].world_rank};
  // Every rank takes the same decision: the first pair found on any node (-1 where none).
  int pair[2] = {out.empty() ? -1 : out[0], out.empty() ? -1 : out[1]};
  int first[2] = {-1, -1};
  mpi::detail::check(MPI_Allreduce(pair, first, 2, MPI_INT, MPI_MAX, world.comm()), "MPI_Allreduce", "of the shared-GPU check in gflow_device_init");
  if (first[0] < 0) return {};
  return {first[0], first[1]};
}

class cuda_world final : public device_support {
 public:
  cuda_world() { set_device_support(this); }
  ~cuda_world() override { set_device_support(nullptr); }

  void init(mpi::transport& world, const std::string& transport, int device) override {
    if (transport != "auto" && transport != "nccl" && transport != "mpi")
      throw invalid_argument("transport", "'" + transport + "' is not a device transport.", "pass 'auto', 'nccl' or 'mpi'.");
    if (initialized()) {
      if ((transport == "auto" || transport == asked_ || transport == chosen()) && (device < 0 || device == device_)) return;
      throw usage_error("transport",
                        fmt::format("the device transport already exists ({} on device {}); it was asked again as {} on device {}.", chosen(), device_,
                                    transport, device),
                        "initialise once per process (gflow.torch.init(transport=..., device=...)), or call gflow.torch.shutdown() first.");
    }
    const int d = device < 0 ? mpi_device::local_device(world.comm()) : device;
    gflow::detail::cuda::check_cuda(cudaSetDevice(d), "cudaSetDevice in gflow_device_init");
    const std::vector<int> shared = shared_gpus(world, d);
    const bool nccl_ok = shared.empty();
    if (transport == "nccl" && !nccl_ok)
      throw usage_error("transport",
                        fmt::format("ranks {} and {} share one GPU, and NCCL refuses two ranks of a communicator on one device.", shared[0], shared[1]),
                        "use transport='mpi' (gflow::mpi_device::transport, through host buffers), or give each rank a GPU of its own "
                        "(as many ranks per node as GPUs; CUDA_VISIBLE_DEVICES).");
    if (transport == "nccl" || (transport == "auto" && nccl_ok)) {
      ncclUniqueId id{};
      if (world.rank() == 0) id = nccl::transport::unique_id();
      mpi::detail::check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world.comm()), "MPI_Bcast", "of the NCCL id in gflow_device_init");
      nccl_.emplace(nccl::transport::init_rank(world.size(), id, world.rank(), d));
    } else {
      mpi_.emplace(world.comm(), d);
    }
    device_ = d;
    asked_ = transport;
  }
  bool initialized() const override { return mpi_.has_value() || nccl_.has_value(); }
  int device() const override { return device_; }
  space transport_space() const override { return nccl_.has_value() ? space::device_nccl : space::device_mpi; }
  void* transport() override {
    if (mpi_) return &*mpi_;
    if (nccl_) return &*nccl_;
    return nullptr;
  }
  int device_count() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: none visible
      return 0;
    }
    return n;
  }
  void finalize() override {
    mpi_.reset();
    nccl_.reset();
    asked_.clear();
    device_ = -1;
  }

 private:
  const char* chosen() const { return nccl_.has_value() ? "nccl" : "mpi"; }

  std::optional<mpi_device::transport> mpi_;
  std::optional<nccl::transport> nccl_;
  int device_ = -1;
  std::string asked_;
};

cuda_world the_cuda_world;  // registers itself when the library loads

}  // namespace
}  // namespace gflow::python
