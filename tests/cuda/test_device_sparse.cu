// The exchanger's device path against its host path, bit for bit (issue 12): for P = 1..4 ranks,
// fp32 / fp16 / bf16 wires and Dense / CSC / TopK / GTopK / OkTopK (also fused), the same inputs go through
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

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;

// Iteration it of rank r, element i: a spread of magnitudes (so selections have clear winners
// and near-ties), one +inf at iteration 3 on rank 0 (reported through the exchange status).
float input(int r, int it, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(r) * 1000003u + static_cast<std::uint64_t>(it) * 7919u + i) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  const float u = static_cast<float>(x & 0xffffff) / 16777216.0f - 0.5f;        // [-0.5, 0.5)
  const float scale = std::ldexp(1.0f, -static_cast<int>((x >> 24) % 12));      // 2^0 .. 2^-11
  if (it == 3 && r == 0 && i == 123) return std::numeric_limits<float>::infinity();
  return u * scale;
}

struct record {
  std::vector<std::vector<float>> pools, residuals;  // per iteration
  std::vector<std::size_t> nonfinite;
  std::string checkpoint;  // save_state after iteration 2 (then loaded back before iteration 3)
};

template <class Ex>
void configure(Ex& ex) {
  if constexpr (requires { ex.sparsifier().set_warmup(1, 2); }) ex.sparsifier().set_warmup(1, 2);  // CSC: sparse from iteration 2
  if constexpr (requires { ex.sparsifier().set_params(gflow::detail::oktopk_params{}); }) {
    // OkTopK: exact selections every 3rd iteration, boundaries every 2nd, threshold selections in between
    gflow::detail::oktopk_params p;
    p.threshold_period = 3;
    p.boundary_period = 2;
    ex.sparsifier().set_params(p);
  }
}

constexpr int iterations = 6;

gflow::Layout layout() { return gflow::Layout::from_sizes({1000, 3, 7000, 17, 4096, 5, 20000}); }

template <class Ex, class Transport>
void run_rank(Transport& t, record& out) {
  constexpr bool device = std::is_same_v<typename Transport::memory_space, gflow::device_memory>;
  const gflow::Layout l = layout();
  Ex ex(t, l);
  configure(ex);
  const std::size_t total = ex.pool_size();
  for (int it = 0; it < iterations; ++it) {
    for (std::size_t k = 0; k < l.size(); ++k) {
      auto v = ex.view(k);
      const std::size_t off = static_cast<std::size_t>(v.data() - ex.pool_data());
      std::vector<float> h(v.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = input(t.rank(), it, off + i);
      if constexpr (device) {
        ok(cudaMemcpyAsync(v.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, t.stream()), "H2D of a gradient");
        ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
      } else {
        std::memcpy(v.data(), h.data(), h.size() * sizeof(float));
      }
      ex.ready(k);
    }
    const gflow::exchange_status st = ex.finish();
    out.nonfinite.push_back(st.nonfinite);
    std::vector<float> pool(total);
    if constexpr (device) {
      ok(cudaMemcpyAsync(pool.data(), ex.pool_data(), total * sizeof(float), cudaMemcpyDeviceToHost, t.stream()), "D2H of the pool");
      ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
    } else {
      std::memcpy(pool.data(), ex.pool_data(), total * sizeof(float));
    }
    out.pools.push_back(std::move(pool));
    if constexpr (requires { ex.sparsifier().residual(); }) {
      auto r = ex.sparsifier().residual();
      std::vector<float> res(r.size());
      if constexpr (device) {
        ok(cudaMemcpyAsync(res.data(), r.data(), r.size() * sizeof(float), cudaMemcpyDeviceToHost, t.stream()), "D2H of the residual");
        ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
      } else {
        std::memcpy(res.data(), r.data(), r.size() * sizeof(float));
      }
      out.residuals.push_back(std::move(res));
    }
    if (it == 2) {  // checkpoints: the same bytes on both paths, and a load resumes bitwise
      std::ostringstream o;
      ex.save_state(o);
      out.checkpoint = o.str();
      std::istringstream in(out.checkpoint);
      ex.load_state(in);
    }
  }
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b, std::size_t* first) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *first = i;
      return false;
    }
  return true;
}

template <class Scheme, class Wire, class... More>
void compare(int P, const char* scheme, const char* wire) {
  using policies = gflow::Exchanger<gflow::Sparsifier<Scheme>, gflow::Precision<Wire>, More...>;
  using host_ex = typename policies::template on<gflow::inproc::transport>;
  using dev_ex = typename policies::template on<gflow::inproc_device::transport>;
  std::vector<record> host(static_cast<std::size_t>(P)), dev(static_cast<std::size_t>(P));
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) { run_rank<host_ex>(t, host[static_cast<std::size_t>(t.rank())]); });
  gflow::inproc_device::run(P, [&](gflow::inproc_device::transport& t) { run_rank<dev_ex>(t, dev[static_cast<std::size_t>(t.rank())]); });
  const std::string what = std::string(scheme) + " " + wire + " P=" + std::to_string(P);
  for (int r = 0; r < P; ++r) {
    const record& h = host[static_cast<std::size_t>(r)];
    const record& d = dev[static_cast<std::size_t>(r)];
    EXPECT_MSG(h.pools.size() == d.pools.size() && h.residuals.size() == d.residuals.size(), what + ": iteration counts");
    for (std::size_t it = 0; it < h.pools.size() && it < d.pools.size(); ++it) {
      std::size_t at = 0;
      EXPECT_MSG(same_bytes(h.pools[it], d.pools[it], &at),
                 what + " rank " + std::to_string(r) + " iteration " + std::to_string(it) + ": pools differ at " + std::to_string(at));
      EXPECT_MSG(h.nonfinite[it] == d.nonfinite[it], what + " rank " + std::to_string(r) + " iteration " + std::to_string(it) + ": inf/NaN counts " +
                                                         std::to_string(h.nonfinite[it]) + " (host) vs " + std::to_string(d.nonfinite[it]));
      if (it == 0)
        EXPECT_MSG(!h.checkpoint.empty() && h.checkpoint == d.checkpoint, what + " rank " + std::to_string(r) + ": save_state bytes differ");
      if (it < h.residuals.size() && it < d.residuals.size())
        EXPECT_MSG(same_bytes(h.residuals[it], d.residuals[it], &at),
                   what + " rank " + std::to_string(r) + " iteration " + std::to_string(it) + ": residuals differ at " + std::to_string(at));
    }
  }
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
  }
}
