// The exchanger's device path against its host path, bit for bit (issue 12): for P = 1..4 ranks,
// fp32 / fp16 / bf16 wires and Dense / CSC / TopK / GTopK / OkTopK (also fused), and from P = 2
// Hierarchical<2> and Overlap<Concurrent<2>> (sub-groups on device memory), and Sharding<ReduceScatter>
// (the shard and gather_shards; Dense and OkTopK), the same inputs go through
//   - Exchanger<...>::on<gflow::inproc::transport>          (host memory, host_backend), and
//   - Exchanger<...>::on<gflow::inproc_device::transport>   (device memory, device_backend: the
//     CUDA kernels on each rank's stream; P ranks as threads on one GPU),
// and after every iteration the pools, the exchange status (inf/NaN count) and the residuals must
// be identical bytes, and so must save_state's checkpoint after iteration 2 (which both paths
// then load back before going on). Both transports reduce in rank order in fp32 (transport/inproc.hpp), so any
// difference is the device backend's or the engines' device path. Suite "device" (ctest
// cuda_device_sparse); skipped (77) without a GPU.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/cuda/inproc_transport.cuh>
#include <gflow/transport/inproc.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "exchange_record.cuh"
#include "harness.cuh"

namespace {

using namespace gflow_cuda_test;

template <class Scheme, class Wire, class... More>
void compare(int P, const char* scheme, const char* wire) {
  using policies = gflow::Exchanger<gflow::Sparsifier<Scheme>, gflow::Precision<Wire>, More...>;
  using host_ex = typename policies::template on<gflow::inproc::transport>;
  using dev_ex = typename policies::template on<gflow::inproc_device::transport>;
  std::vector<record> host(static_cast<std::size_t>(P)), dev(static_cast<std::size_t>(P));
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) { run_rank<host_ex>(t, host[static_cast<std::size_t>(t.rank())]); });
  gflow::inproc_device::run(P, [&](gflow::inproc_device::transport& t) { run_rank<dev_ex>(t, dev[static_cast<std::size_t>(t.rank())]); });
  const std::string what = std::string(scheme) + " " + wire + " P=" + std::to_string(P);
  for (int r = 0; r < P; ++r) expect_same_records(host[static_cast<std::size_t>(r)], dev[static_cast<std::size_t>(r)], what, r);
  std::printf("  %-6s %-5s P=%d compared\n", scheme, wire, P);
  std::fflush(stdout);
}

template <class Scheme, class... More>
void every_wire(int P, const char* name) {
  compare<Scheme, float, More...>(P, name, "fp32");
  compare<Scheme, gflow::half, More...>(P, name, "fp16");
  compare<Scheme, gflow::bfloat16, More...>(P, name, "bf16");
}

}  // namespace

GFLOW_CUDA_TEST("device", device_exchanges_equal_host_exchanges_bitwise) {
  for (int P = 1; P <= 4; ++P) {
    every_wire<gflow::None>(P, "Dense");
    every_wire<gflow::CSC<1024, 25>>(P, "CSC");
    every_wire<gflow::TopK<0.01>>(P, "TopK");
    every_wire<gflow::GTopK<0.01>>(P, "GTopK");
    every_wire<gflow::OkTopK<0.01>>(P, "OkTopK");
    every_wire<gflow::OkTopK<0.02>, gflow::Fusion<(16 << 10)>>(P, "OkTopK+F");
    // Sharding<ReduceScatter> (the shard after finish(), then gather_shards): fused, and per
    // tensor with a 16-bit wire (buckets smaller than P: empty blocks); two levels where 2 divides P.
    compare<gflow::None, float, gflow::Fusion<(16 << 10)>, gflow::Sharding<gflow::ReduceScatter>>(P, "Dense+S", "fp32");
    compare<gflow::None, gflow::half, gflow::Sharding<gflow::ReduceScatter>>(P, "Dense+S", "fp16");
    // Compressed and sharded: OkTopK's split-and-reduce over the shards.
    compare<gflow::OkTopK<0.02>, float, gflow::Fusion<(16 << 10)>, gflow::Sharding<gflow::ReduceScatter>>(P, "OkTopK+S", "fp32");
    compare<gflow::OkTopK<0.02>, gflow::half, gflow::Sharding<gflow::ReduceScatter>>(P, "OkTopK+S", "fp16");
    if (P % 2 == 0)
      compare<gflow::None, float, gflow::Topology<gflow::Hierarchical<2>>, gflow::Fusion<(16 << 10)>, gflow::Sharding<gflow::ReduceScatter>>(P, "Dense+H2+S", "fp32");
    if (P >= 2) {  // sub-groups (split) on device memory: they share the rank's stream
      compare<gflow::None, float, gflow::Topology<gflow::Hierarchical<2>>, gflow::Fusion<(16 << 10)>>(P, "Dense+H2", "fp32");
      compare<gflow::CSC<1024, 25>, gflow::half, gflow::Topology<gflow::Hierarchical<2>>>(P, "CSC+H2", "fp16");
      compare<gflow::None, float, gflow::Fusion<(16 << 10)>, gflow::Overlap<gflow::Concurrent<2>>>(P, "Dense+C2", "fp32");
    }
  }
}
