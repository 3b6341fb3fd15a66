// broadcast_parameters and verify_replicas on device memory (replicas.hpp, cuda/replicas.cuh):
// P = 1..3 ranks as threads on one GPU (gflow::inproc_device::transport). The device fingerprints
// equal the host's for the same values; a broadcast leaves the replicas bitwise equal; one flipped
// bit on one rank is named on every rank. Compiled in CI; runs where a GPU is.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/cuda/inproc_transport.cuh>
#include <gflow/detail/cuda/memory.cuh>
#include <gflow/transport/inproc.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "harness.cuh"

namespace {

gflow::Layout replica_layout() {
  return gflow::Layout({{"conv.weight", {16, 3, 3, 3}, 432}, {"bn.running_mean", {16}, 16}, {"fc.weight", {10, 16}, 160}, {"fc.bias", {10}, 10}});
}

std::vector<float> values_for(const gflow::Layout& l, int rank) {
  std::vector<float> v(l.total_numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.1f + static_cast<float>(rank));
  return v;
}

void to_device(float* d, const std::vector<float>& h, cudaStream_t s) {
  gflow::detail::cuda::check_cuda(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s), "H2D of replica values");
  gflow::detail::cuda::check_cuda(cudaStreamSynchronize(s), "sync");
}
std::vector<float> to_host(const float* d, std::size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  gflow::detail::cuda::check_cuda(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s), "D2H of replica values");
  gflow::detail::cuda::check_cuda(cudaStreamSynchronize(s), "sync");
  return h;
}

}  // namespace

GFLOW_CUDA_TEST("device", replicas_device_fingerprints_match_host) {
  const gflow::Layout l = replica_layout();
  const std::vector<float> h = values_for(l, 0);
  gflow::inproc_device::run(1, [&](gflow::inproc_device::transport& t) {
    gflow::detail::cuda::device_array<float> d(h.size(), "replica values");
    to_device(d.get(), h, t.stream());
    std::vector<std::uint64_t> dev(l.size()), host(l.size());
    gflow::detail::replica_reader<gflow::device_memory>::fingerprints(t, d.get(), l, dev.data());
    gflow::detail::replica_reader<gflow::host_memory>::fingerprints(t, h.data(), l, host.data());
    EXPECT(dev == host);
  });
}

GFLOW_CUDA_TEST("device", replicas_device_broadcast_then_verify) {
  const gflow::Layout l = replica_layout();
  for (int P = 1; P <= 3; ++P) {
    std::mutex m;
    std::vector<std::string> msgs(static_cast<std::size_t>(P));
    gflow::inproc_device::run(P, [&](gflow::inproc_device::transport& t) {
      gflow::detail::cuda::device_array<float> d(l.total_numel(), "replica values");
      to_device(d.get(), values_for(l, t.rank()), t.stream());
      const std::span<float> dv(d.get(), l.total_numel());
      gflow::broadcast_parameters(t, dv, P - 1);
      const std::vector<float> got = to_host(d.get(), l.total_numel(), t.stream());
      const std::vector<float> want = values_for(l, P - 1);
      EXPECT(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      gflow::verify_replicas(t, dv, l);  // equal: returns
      if (P > 1 && t.rank() == 1) {  // one bit of tensor 2 on rank 1
        std::vector<float> bad = got;
        std::uint32_t w;
        std::memcpy(&w, &bad[432 + 16 + 3], sizeof w);
        w ^= 1u;
        std::memcpy(&bad[432 + 16 + 3], &w, sizeof w);
        to_device(d.get(), bad, t.stream());
      }
      try {
        gflow::verify_replicas(t, dv, l);
      } catch (const gflow::mismatch_error& e) {
        std::lock_guard lk(m);
        msgs[static_cast<std::size_t>(t.rank())] = e.what();
      }
    });
    for (const std::string& s : msgs) {
      if (P == 1) {
        EXPECT(s.empty());
      } else {
        EXPECT_MSG(s.find("The first is tensor 2 (layout index) 'fc.weight' [10x16] (160 elements): ranks that differ from rank 0 there: 1;") !=
                       std::string::npos,
                   s);
      }
    }
  }
}
