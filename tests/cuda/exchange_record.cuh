#pragma once
// What the tests that compare whole exchanges share (test_device_sparse.cu: the device path against
// the host path in one process; test_mpi_device.cu: under mpiexec): each rank's gradients per
// iteration, what is recorded of an exchange (pools, residuals, inf/NaN counts, a checkpoint),
// the sparsifiers' settings, and the bytewise comparison of two records.
#include <cuda_runtime.h>

#include <gflow/cuda/exchanger.cuh>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace gflow_cuda_test {

// Iteration it of rank r, element i: a spread of magnitudes (so selections have clear winners
// and near-ties), one +inf at iteration 3 on rank 0 (reported through the exchange status).
inline float input(int r, int it, std::size_t i) {
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
  std::vector<std::vector<float>> gathered;          // Sharding: gather_shards' result, per iteration
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

inline gflow::Layout layout() { return gflow::Layout::from_sizes({1000, 3, 7000, 17, 4096, 5, 20000}); }

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
    if constexpr (requires { ex.shard(); }) {
      // Sharding<ReduceScatter>: the pool holds the average in this rank's shard only (elsewhere it
      // is unspecified): recorded there, zeros elsewhere. Then gather_shards of a pool-shaped
      // parameter buffer (this rank's values), recorded as it comes back.
      std::vector<float> kept(total, 0.0f);
      for (const gflow::pool_range g : ex.shard())
        std::memcpy(kept.data() + g.begin, pool.data() + g.begin, g.size() * sizeof(float));
      out.pools.push_back(std::move(kept));
      std::vector<float> w(total);
      for (std::size_t i = 0; i < total; ++i) w[i] = input(t.rank(), it + 100, i);
      if constexpr (device) {
        float* d = nullptr;
        ok(cudaMalloc(&d, (total + 1) * sizeof(float)), "cudaMalloc of the gathered parameters");
        const std::unique_ptr<float, decltype(&cudaFree)> guard(d, &cudaFree);
        ok(cudaMemcpyAsync(d, w.data(), total * sizeof(float), cudaMemcpyHostToDevice, t.stream()), "H2D of the parameters");
        ex.gather_shards(std::span<float>(d, total));
        ok(cudaMemcpyAsync(w.data(), d, total * sizeof(float), cudaMemcpyDeviceToHost, t.stream()), "D2H of the parameters");
        ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
      } else {
        ex.gather_shards(std::span<float>(w));
      }
      out.gathered.push_back(std::move(w));
    } else {
      out.pools.push_back(std::move(pool));
    }
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

inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b, std::size_t* first) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *first = i;
      return false;
    }
  return true;
}

/// Checks that b recorded the same bytes as a (rank r's exchange `what`), iteration by iteration.
inline void expect_same_records(const record& a, const record& b, const std::string& what, int r) {
  EXPECT_MSG(a.pools.size() == b.pools.size() && a.residuals.size() == b.residuals.size() && a.gathered.size() == b.gathered.size(),
             what + ": iteration counts");
  for (std::size_t it = 0; it < a.pools.size() && it < b.pools.size(); ++it) {
    const std::string at_it = what + " rank " + std::to_string(r) + " iteration " + std::to_string(it);
    std::size_t at = 0;
    EXPECT_MSG(same_bytes(a.pools[it], b.pools[it], &at), at_it + ": pools differ at " + std::to_string(at));
    EXPECT_MSG(a.nonfinite[it] == b.nonfinite[it],
               at_it + ": inf/NaN counts " + std::to_string(a.nonfinite[it]) + " vs " + std::to_string(b.nonfinite[it]));
    if (it == 0)
      EXPECT_MSG(!a.checkpoint.empty() && a.checkpoint == b.checkpoint, what + " rank " + std::to_string(r) + ": save_state bytes differ");
    if (it < a.residuals.size() && it < b.residuals.size())
      EXPECT_MSG(same_bytes(a.residuals[it], b.residuals[it], &at), at_it + ": residuals differ at " + std::to_string(at));
    if (it < a.gathered.size() && it < b.gathered.size())
      EXPECT_MSG(same_bytes(a.gathered[it], b.gathered[it], &at), at_it + ": gather_shards results differ at " + std::to_string(at));
  }
}

/// True when b recorded the same bytes as a (no check counted): for comparisons that are reported
/// rather than required.
inline bool same_records(const record& a, const record& b) {
  if (a.pools.size() != b.pools.size() || a.residuals.size() != b.residuals.size() || a.gathered.size() != b.gathered.size() ||
      a.nonfinite != b.nonfinite || a.checkpoint != b.checkpoint)
    return false;
  std::size_t at = 0;
  for (std::size_t it = 0; it < a.pools.size(); ++it)
    if (!same_bytes(a.pools[it], b.pools[it], &at)) return false;
  for (std::size_t it = 0; it < a.residuals.size(); ++it)
    if (!same_bytes(a.residuals[it], b.residuals[it], &at)) return false;
  for (std::size_t it = 0; it < a.gathered.size(); ++it)
    if (!same_bytes(a.gathered[it], b.gathered[it], &at)) return false;
  return true;
}

}  // namespace gflow_cuda_test
