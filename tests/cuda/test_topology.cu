// Topology<Hierarchical<g>> and Topology<Hybrid<t, g>> over gflow::nccl::transport, on every
// visible GPU (init_all; one host thread per rank), for every group size 1..P: the blocking
// form (run) and the stream-ordered form (start enqueues reduce / allreduce / broadcast on the
// shared stream, wait once) both equal ncclAllReduce bit for bit on integer-valued inputs, and
// the Exchanger over them equals the ring's. With one GPU these are 1-rank runs: they still
// exercise ncclCommSplit, the stream sharing of the sub-groups and the device code paths.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/policies/topology.hpp>
#include <gflow/transport/nccl.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;
using gflow_cuda_test::dbuf;
using gflow_cuda_test::device_count;
using gflow_cuda_test::run_ranks;

using gflow::nccl::transport;
using hier_engine = gflow::Hierarchical<1>::engine<transport>;  // group size given at run time
static_assert(hier_engine::nonblocking_start, "NCCL is stream-ordered: Hierarchical's start must enqueue without a host wait");

// Integer-valued in [-8, 8]: exact sums in any order.
float int_value(int rank, std::size_t j) { return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + j * 5) % 17) - 8); }

}  // namespace

GFLOW_CUDA_TEST("nccl", hierarchical_equals_ring_for_every_group_size) {
  auto ranks = transport::init_all(device_count());
  const int P = static_cast<int>(ranks.size());
  for (int g = 1; g <= P; ++g) {
    run_ranks(ranks, [P, g](transport& t) {
      hier_engine e(t, g);
      EXPECT(e.group().stream() == t.stream());  // one stream orders every phase
      EXPECT(e.group().rank() == t.rank() % g);
      const std::size_t n = 10007;
      std::vector<float> h(n);
      for (std::size_t j = 0; j < n; ++j) h[j] = int_value(t.rank(), j);
      dbuf<float> blocking(n), chained(n), ring(n);
      blocking.put(h);
      chained.put(h);
      ring.put(h);
      e.run(blocking.p, n);
      auto q = e.start(chained.p, n);  // enqueued: no host wait until e.wait
      e.wait(q);
      t.all_reduce(ring.p, n, gflow::reduce_op::sum);
      const auto a = blocking.get(), b = chained.get(), c = ring.get();
      bool exact = true;
      for (std::size_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int r = 0; r < P; ++r) sum += int_value(r, j);
        exact &= a[j] == sum;
      }
      EXPECT_MSG(exact, "g = " + std::to_string(g) + ", rank " + std::to_string(t.rank()));
      EXPECT(std::memcmp(a.data(), c.data(), n * sizeof(float)) == 0);
      EXPECT(std::memcmp(b.data(), c.data(), n * sizeof(float)) == 0);
    });
  }
  run_ranks(ranks, [P](transport& t) { EXPECT_THROWS_AS(hier_engine(t, P + 1), gflow::invalid_argument); });
}

namespace {

template <class Topo>
void exchanger_equals_ring(const char* label) {
  using H = typename gflow::Exchanger<gflow::Fusion<(64 << 10)>, gflow::Topology<Topo>>::template on<transport>;
  using R = typename gflow::Exchanger<gflow::Fusion<(64 << 10)>>::template on<transport>;
  auto ranks = transport::init_all(device_count());
  const gflow::Layout layout = gflow::Layout::from_sizes({1000, 3, 70000, 17, 4096, 5});
  run_ranks(ranks, [&](transport& t) {
    auto pool_after = [&](auto& ex) {
      for (std::size_t k = layout.size(); k-- > 0;) {
        std::vector<float> h(layout[k].numel);
        for (std::size_t j = 0; j < h.size(); ++j) h[j] = int_value(t.rank(), j + 131 * k);
        auto v = ex.view(k);
        ok(cudaMemcpy(v.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), "H2D");
        ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the H2D copy");  // the exchange runs on the transport's stream
        ex.ready(k);
      }
      (void)ex.finish();
      std::vector<float> pool(ex.pool_size());
      ok(cudaMemcpy(pool.data(), ex.pool_data(), pool.size() * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
      return pool;
    };
    H hx(t, layout);
    R rx(t, layout);
    const auto a = pool_after(hx);
    const auto b = pool_after(rx);
    EXPECT_MSG(a == b, std::string(label) + ": rank " + std::to_string(t.rank()) + " differs from the ring");
  });
}

}  // namespace

GFLOW_CUDA_TEST("nccl", exchanger_through_hierarchical_and_hybrid) {
  exchanger_equals_ring<gflow::Hierarchical<1>>("Hierarchical<1>");
  exchanger_equals_ring<gflow::Hybrid<(16 << 10), 1>>("Hybrid<16 KiB, 1>");
  if (device_count() >= 2) exchanger_equals_ring<gflow::Hierarchical<2>>("Hierarchical<2>");
}
