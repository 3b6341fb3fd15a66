// gflow::mpi_device::transport under mpiexec (suite "mpi_device", binary gflow_cuda_mpi_tests, one
// process per rank, every rank on one GPU when there is one): for Dense / CSC / TopK / GTopK /
// OkTopK (also fused), a hierarchical topology and three overlap strategies, fp32 / fp16 / bf16
// wires, each rank runs the same gradients (exchange_record.cuh) through
//   - Exchanger<...>::on<gflow::mpi::transport>          (host memory, the MPI transport),
//   - Exchanger<...>::on<gflow::mpi_device::transport>   (device memory, staged through page-locked
//     buffers or handed to a CUDA-aware MPI), and
//   - Exchanger<...>::on<gflow::inproc::transport> with P threads of this process (every rank of
//     the reference; this rank compares its own),
// and the device records must equal the host MPI ones byte for byte (the transport adds nothing to
// the result), and the in-process ones wherever MPI reduces in the in-process transport's order:
// every scheme at P <= 2, and at any P the schemes whose sums the engines make themselves (TopK,
// GTopK, OkTopK: gathers and point-to-point, integer all_reduces). (The device suite checks that
// inproc_device gives the in-process bytes.) Where MPI's order may differ (Dense and CSC from
// P = 3, MPI_Allreduce's algorithm) the comparison is printed, not required. Also: the typed errors of a bad device and of path::direct on an MPI without CUDA
// support. ctest cuda_mpi_device_{1,2,4}; skipped (77) without a GPU.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/cuda/inproc_transport.cuh>
#include <gflow/cuda/mpi_transport.cuh>
#include <gflow/detail/cuda/memory.cuh>
#include <gflow/transport/mpi.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "exchange_record.cuh"
#include "harness.cuh"

namespace {

using namespace gflow_cuda_test;

struct world {
  gflow::mpi::transport host{MPI_COMM_WORLD, std::chrono::seconds(120)};
  int device = gflow::mpi_device::local_device(MPI_COMM_WORLD);
  gflow::mpi_device::transport dev{MPI_COMM_WORLD, device, std::chrono::seconds(120)};
};

template <class Policies>
void compare(world& w, const std::string& what, bool inproc_order) {
  using host_ex = typename Policies::template on<gflow::mpi::transport>;
  using dev_ex = typename Policies::template on<gflow::mpi_device::transport>;
  using ref_ex = typename Policies::template on<gflow::inproc::transport>;
  const int P = w.host.size(), r = w.host.rank();
  const std::string at = what + " P=" + std::to_string(P);
  record h, d;
  run_rank<host_ex>(w.host, h);
  run_rank<dev_ex>(w.dev, d);
  expect_same_records(h, d, at + ": mpi_device against mpi (host)", r);
  // The in-process host run of every rank (its device twin, inproc_device, is the device suite's
  // business): where MPI sums in its order, the MPI runs must give its bytes.
  std::vector<record> ref(static_cast<std::size_t>(P));
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) { run_rank<ref_ex>(t, ref[static_cast<std::size_t>(t.rank())]); });
  const record& mine = ref[static_cast<std::size_t>(r)];
  if (inproc_order || P <= 2) {
    expect_same_records(mine, d, at + ": mpi_device against inproc (host)", r);
  } else if (r == 0) {
    std::printf("  (reported, not required) %s: mpi_device against inproc (host): %s\n", at.c_str(),
                same_records(mine, d) ? "equal bytes" : "differ (MPI_Allreduce's order)");
  }
  w.dev.barrier();
  if (r == 0) std::printf("  %-40s P=%d compared\n", what.c_str(), P);
  std::fflush(stdout);
}

template <class Scheme, class... More>
void every_wire(world& w, const char* name, bool inproc_order) {
  compare<gflow::Exchanger<gflow::Sparsifier<Scheme>, gflow::Precision<float>, More...>>(w, std::string(name) + " fp32", inproc_order);
  compare<gflow::Exchanger<gflow::Sparsifier<Scheme>, gflow::Precision<gflow::half>, More...>>(w, std::string(name) + " fp16", inproc_order);
  compare<gflow::Exchanger<gflow::Sparsifier<Scheme>, gflow::Precision<gflow::bfloat16>, More...>>(w, std::string(name) + " bf16", inproc_order);
}

}  // namespace

GFLOW_CUDA_TEST("mpi_device", mpi_device_exchanges_equal_host_and_inproc_device_bitwise) {
  world w;
  if (w.host.rank() == 0)
    std::printf("  %d rank(s), device %d, %s\n", w.host.size(), w.device, w.dev.direct() ? "direct (CUDA-aware MPI)" : "staged through page-locked buffers");
  every_wire<gflow::None>(w, "Dense", false);
  every_wire<gflow::CSC<1024, 25>>(w, "CSC", false);
  every_wire<gflow::TopK<0.01>>(w, "TopK", true);
  every_wire<gflow::GTopK<0.01>>(w, "GTopK", true);
  every_wire<gflow::OkTopK<0.01>>(w, "OkTopK", true);
  every_wire<gflow::OkTopK<0.02>, gflow::Fusion<(16 << 10)>>(w, "OkTopK+Fusion", true);
  if (w.host.size() >= 2)  // a group of 2 needs 2 ranks (E28)
    compare<gflow::Exchanger<gflow::Topology<gflow::Hierarchical<2>>, gflow::Fusion<(16 << 10)>>>(w, "Dense Hierarchical<2>", false);
  compare<gflow::Exchanger<gflow::Fusion<(16 << 10)>, gflow::Overlap<gflow::Chained>>>(w, "Dense Overlap<Chained>", false);
  compare<gflow::Exchanger<gflow::Fusion<(16 << 10)>, gflow::Overlap<gflow::Concurrent<2>>>>(w, "Dense Overlap<Concurrent<2>>", false);
  compare<gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.01>>, gflow::Overlap<gflow::Funneled>>>(w, "GTopK Overlap<Funneled>", true);
  // Sharding: MPI_Reduce_scatter's order is MPI's (the in-process run is required at 2 ranks only).
  compare<gflow::Exchanger<gflow::Fusion<(16 << 10)>, gflow::Sharding<gflow::ReduceScatter>>>(w, "Dense Sharding<ReduceScatter>", false);
}

GFLOW_CUDA_TEST("mpi_device", mpi_device_refuses_bad_arguments) {
  int devices = 0;
  ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  EXPECT_THROWS_AS(gflow::mpi_device::transport(MPI_COMM_WORLD, devices), gflow::invalid_argument);
  EXPECT_THROWS_AS(gflow::mpi_device::transport(MPI_COMM_WORLD, -1), gflow::invalid_argument);
  if (!gflow::mpi_device::cuda_aware_mpi())
    EXPECT_THROWS_AS(gflow::mpi_device::transport(MPI_COMM_WORLD, 0, std::chrono::seconds(60), gflow::mpi_device::path::direct), gflow::usage_error);
  // A staged transport on a split group still reaches every rank of it.
  gflow::mpi_device::transport t(MPI_COMM_WORLD, 0, std::chrono::seconds(60), gflow::mpi_device::path::staged);
  EXPECT(!t.direct());
  auto half = t.split(t.rank() % 2, t.rank());
  gflow::detail::cuda::device_array<float> v(1, "a test value");
  const float one = 1.0f;
  ok(cudaMemcpy(v.get(), &one, sizeof(float), cudaMemcpyHostToDevice), "H2D");
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // a pageable H2D may return before the data lands
  half.all_reduce(v.get(), 1, gflow::reduce_op::sum);
  float got = 0;
  ok(cudaStreamSynchronize(half.stream()), "sync");
  ok(cudaMemcpy(&got, v.get(), sizeof(float), cudaMemcpyDeviceToHost), "D2H");
  EXPECT_MSG(got == static_cast<float>(half.size()), "split group's sum " + std::to_string(got));
}
