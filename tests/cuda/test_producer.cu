// Exchanger::set_producer_stream: the exchange stream waits for the trainer's backward stream by
// an event, with no host synchronisation in ready(). A slow kernel on the producer stream fills
// the gradient that ready(i, source) copies; without the event the copy, on the exchange stream,
// would take the stale zeros.
#include <gflow/cuda/exchanger.cuh>

#include <cstdio>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;

__global__ void slow_fill(float* p, std::size_t n, float v, long long spin_cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) p[i] = v;
}


}  // namespace

GFLOW_CUDA_TEST("nccl", producer_stream_orders_the_copy_and_the_exchange) {
  using transport = gflow::nccl::transport;
  using Ex = typename gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<(1 << 20)>>::template on<transport>;
  auto ranks = transport::init_all(1);
  transport& t = ranks[0];
  ok(cudaSetDevice(t.device()), "cudaSetDevice");
  const gflow::Layout layout = gflow::Layout::from_sizes({4096, 100000, 7});
  cudaStream_t producer = nullptr;
  ok(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<float*> sources(layout.size(), nullptr);
  for (std::size_t k = 0; k < layout.size(); ++k) {
    ok(cudaMalloc(&sources[k], layout[k].numel * sizeof(float)), "cudaMalloc");
    ok(cudaMemset(sources[k], 0, layout[k].numel * sizeof(float)), "cudaMemset");
  }
  {
    Ex ex(t, layout);
    ex.set_producer_stream(producer);
    for (std::size_t k = layout.size(); k-- > 0;) {
      slow_fill<<<64, 256, 0, producer>>>(sources[k], layout[k].numel, static_cast<float>(k + 1), 20'000'000);  // ~10 ms
      ok(cudaGetLastError(), "slow_fill launch");
      ex.ready(k, std::span<const float>(sources[k], layout[k].numel));
    }
    auto st = ex.finish();
    EXPECT(st.finite());
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (std::size_t k = 0; k < layout.size(); ++k) {
      std::vector<float> h(layout[k].numel);
      ok(cudaMemcpy(h.data(), ex.view(k).data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
      std::size_t wrong = 0;
      for (float x : h) wrong += (x != static_cast<float>(k + 1));
      EXPECT(wrong == 0);
    }
  }
  for (float* p : sources) (void)cudaFree(p);
  (void)cudaStreamDestroy(producer);
}
