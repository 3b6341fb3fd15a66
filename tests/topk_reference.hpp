#pragma once
// Brute-force references of Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> shared by the Top-k
// kernel, engine and result tests: deterministic gradients, brute-force top-k, the reference of
// both schemes (std::map lists, one thread, P ranks), and a runner that checks an exchanger on P
// in-process ranks against it bit for bit.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/detail/kernels/topk.hpp>
#include <gflow/detail/plan/buckets.hpp>
#include <gflow/detail/plan/density.hpp>
#include <gflow/detail/plan/pool.hpp>
#include <gflow/detail/plan/tree.hpp>
#include <gflow/transport/inproc.hpp>

#include "compositions.hpp"

namespace gflow_test {

using namespace gflow;
namespace k_ = gflow::detail::kernels;

inline std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

/// Gradient of rank r at pool index i in iteration it. mode 0: uniform in [-1, 1); mode 1: few
/// distinct values (many ties); mode 2: zeros.
inline float grad(int mode, int r, std::size_t i, int it, std::uint64_t seed = 0) {
  if (mode == 2) return 0.0f;
  std::uint64_t x = seed ^ (std::uint64_t(r + 1) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(i) * 0xBF58476D1CE4E5B9ull) ^
                    (std::uint64_t(it + 1) * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  if (mode == 1) return static_cast<float>(static_cast<int>(x % 5) - 2);  // -2..2
  return static_cast<float>(static_cast<double>(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

/// Brute-force top-k: sort positions by (|v| desc, position asc), take k, return sorted.
inline std::vector<std::size_t> brute_topk(const float* v, std::size_t n, std::size_t k) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::sort(p.begin(), p.end(), [&](std::size_t a, std::size_t b) {
    const auto ka = k_::magnitude_key(v[a]), kb = k_::magnitude_key(v[b]);
    return ka != kb ? ka > kb : a < b;
  });
  p.resize(std::min(k, n));
  std::sort(p.begin(), p.end());
  return p;
}

// ---- brute-force reference of both schemes (std::map lists, one thread, P ranks) ---------------
template <class W>
struct reference {
  int P;
  bool global;
  bool average;
  std::vector<std::pair<std::size_t, std::size_t>> units;  // (offset, count)
  std::vector<std::vector<float>> res;                     // per rank, pool order
  std::vector<float> result;

  reference(int ranks, bool g, bool avg, std::vector<std::pair<std::size_t, std::size_t>> u, std::size_t n)
      : P(ranks), global(g), average(avg), units(std::move(u)), res(static_cast<std::size_t>(ranks), std::vector<float>(n, 0.0f)), result(n) {}

  static constexpr bool narrow = sizeof(W) < sizeof(float);

  void step(const std::vector<std::vector<float>>& g, double density) {
    const float Pf = static_cast<float>(P);
    const float scale = (narrow && average) ? 1.0f / Pf : 1.0f;
    const float unscale = (narrow && average) ? Pf : 1.0f;
    std::vector<std::vector<float>> G = g;
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < G[q].size(); ++i) G[q][i] = g[q][i] + res[q][i];
    for (int q = 0; q < P; ++q) res[q] = G[q];
    for (auto [off, n] : units) {
      const std::size_t k = gflow::detail::plan::k_for(density, n);
      std::vector<std::map<std::size_t, W>> mine(static_cast<std::size_t>(P));
      for (int q = 0; q < P; ++q)
        for (std::size_t p : brute_topk(G[q].data() + off, n, k)) {
          const std::size_t i = off + p;
          const W w = k_::wire_cast<W>(k_::sanitize(G[q][i] * scale));
          mine[q][i] = w;
          res[q][i] = G[q][i] - k_::to_float(w) * unscale;
        }
      std::fill(result.begin() + static_cast<std::ptrdiff_t>(off), result.begin() + static_cast<std::ptrdiff_t>(off + n), 0.0f);
      if (!global) {
        for (int q = 0; q < P; ++q)
          for (auto [i, w] : mine[q]) result[i] += k_::to_float(w);
        if (!narrow && average)
          for (std::size_t i = off; i < off + n; ++i) result[i] = result[i] * (1.0f / Pf);
        continue;
      }
      // tree
      std::vector<std::map<std::size_t, W>> list = mine;
      std::vector<std::vector<std::pair<std::size_t, float>>> records(static_cast<std::size_t>(P));
      const int rounds = gflow::detail::plan::gtopk_rounds(P);
      for (int j = 0; j < rounds; ++j) {
        const int half = 1 << j;
        for (int r = 0; r < P; r += 2 * half) {
          if (r + half >= P) continue;
          std::map<std::size_t, float> sum;
          for (auto [i, w] : list[r + half]) sum[i] = k_::to_float(w);
          for (auto [i, w] : list[r]) {
            auto it = sum.find(i);
            if (it == sum.end()) sum[i] = k_::to_float(w);
            else it->second = k_::sanitize(it->second + k_::to_float(w));
          }
          std::vector<std::size_t> idx;
          std::vector<float> vals;
          for (auto [i, v] : sum) {
            idx.push_back(i);
            vals.push_back(v);
          }
          auto keep = brute_topk(vals.data(), vals.size(), k);
          std::set<std::size_t> kept(keep.begin(), keep.end());
          std::map<std::size_t, W> out;
          for (std::size_t p = 0; p < idx.size(); ++p) {
            if (kept.count(p)) {
              const W w = k_::wire_cast<W>(vals[p]);
              out[idx[p]] = w;
              const float err = vals[p] - k_::to_float(w);
              if (err != 0.0f) records[r].push_back({idx[p], err});
            } else {
              records[r].push_back({idx[p], vals[p]});
            }
          }
          list[r] = out;
        }
      }
      const auto& F = list[0];
      const float post = (!narrow && average) ? 1.0f / Pf : 1.0f;
      for (auto [i, w] : F) result[i] = k_::to_float(w) * post;
      for (int q = 0; q < P; ++q)
        for (auto [i, w] : mine[q])
          if (!F.count(i)) res[q][i] += k_::to_float(w) * unscale;
      for (int r = 0; r < P; ++r)
        for (auto [i, v] : records[r])
          if (F.count(i)) res[r][i] += v * unscale;
    }
  }
};

/// Per iteration and rank: the pool after finish() and the residual (and, where the engine or the
/// exchanger has them, its selection and this rank's shard).
struct rank_trace {
  std::vector<std::vector<std::vector<float>>> result, residual;  // [iter][rank][i]
  std::vector<std::vector<std::vector<std::uint64_t>>> exchanged, selected;
  std::vector<std::vector<std::size_t>> nonfinite;
  std::vector<std::vector<gflow::pool_range>> shard;  // [rank], Sharding<ReduceScatter> only
};

/// Runs E on P in-process ranks for `iters` iterations with gradients gfn(rank, pool index, iter)
/// written straight into the pool; ready() in a rank-dependent order.
template <class E>
rank_trace run_ranks(int P, const Layout& l, int iters, const std::function<float(int, std::size_t, int)>& gfn,
                     const std::function<void(typename E::template on<inproc::transport>&)>& setup = {}, exchange_options o = {},
                     std::size_t fusion_bytes = 0) {
  rank_trace tr;
  const std::size_t total = l.total_numel();
  tr.result.assign(static_cast<std::size_t>(iters), std::vector<std::vector<float>>(static_cast<std::size_t>(P)));
  tr.residual = tr.result;
  tr.exchanged.assign(static_cast<std::size_t>(iters), std::vector<std::vector<std::uint64_t>>(static_cast<std::size_t>(P)));
  tr.selected = tr.exchanged;
  tr.shard.assign(static_cast<std::size_t>(P), {});
  tr.nonfinite.assign(static_cast<std::size_t>(iters), std::vector<std::size_t>(static_cast<std::size_t>(P)));
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l, o);
    if (fusion_bytes) ex.set_fusion(fusion_bytes);  // 0: the composition's own plan
    if (setup) setup(ex);
    const auto r = static_cast<std::size_t>(t.rank());
    std::mt19937 rng(static_cast<unsigned>(t.rank() * 31 + 7));
    std::vector<std::size_t> order(l.size());
    std::iota(order.begin(), order.end(), 0);
    for (int it = 0; it < iters; ++it) {
      float* pool = ex.pool_data();
      for (std::size_t i = 0; i < total; ++i) pool[i] = gfn(t.rank(), i, it);
      std::shuffle(order.begin(), order.end(), rng);
      for (auto i : order) ex.ready(i);
      const auto st = ex.finish();
      tr.result[it][r].assign(pool, pool + total);
      auto res = ex.sparsifier().residual();
      tr.residual[it][r].assign(res.begin(), res.end());
      auto xs = ex.sparsifier().exchanged();
      tr.exchanged[it][r].assign(xs.begin(), xs.end());
      if constexpr (requires { ex.sparsifier().selected(); }) {
        auto sel = ex.sparsifier().selected();
        tr.selected[it][r].assign(sel.begin(), sel.end());
      }
      tr.nonfinite[it][r] = st.nonfinite;
    }
    if constexpr (requires { ex.shard(); }) {
      auto sh = ex.shard();
      tr.shard[r].assign(sh.begin(), sh.end());
    }
  });
  return tr;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline std::vector<std::pair<std::size_t, std::size_t>> units_of(const Layout& l, std::size_t threshold_bytes, std::size_t wire_bytes) {
  const auto pool = gflow::detail::plan::plan_pool(l);
  if (threshold_bytes == 0) return {{0, pool.total}};
  std::vector<std::pair<std::size_t, std::size_t>> u;
  for (const auto& b : gflow::detail::plan::plan_buckets(l, pool, {wire_bytes, threshold_bytes, 0})) u.push_back({b.offset, b.count});
  return u;
}

/// Checks E on P ranks against the reference, bitwise, over `iters` iterations.
template <class E>
void check_against_reference(int P, const Layout& l, int iters, int mode, double density, std::size_t threshold = 0) {
  using W = typename E::template on<inproc::transport>::wire_type;
  using S = typename E::policies::sparsifier::scheme;
  auto gfn = [mode](int r, std::size_t i, int it) { return grad(mode, r, i, it); };
  auto tr = run_ranks<E>(
      P, l, iters, gfn, [density](auto& ex) { ex.sparsifier().set_density(density); }, {}, threshold);
  const std::size_t total = l.total_numel();
  reference<W> ref(P, S::global, true, units_of(l, threshold, sizeof(W)), total);
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<float>> g(static_cast<std::size_t>(P), std::vector<float>(total));
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < total; ++i) g[q][i] = gfn(q, i, it);
    ref.step(g, density);
    for (int q = 0; q < P; ++q) {
      CAPTURE(q);
      CAPTURE(it);
      CHECK(same_bits(tr.result[it][q], ref.result));
      CHECK(same_bits(tr.residual[it][q], ref.res[q]));
      CHECK(tr.exchanged[it][q] == tr.exchanged[it][0]);
    }
  }
}

}  // namespace gflow_test
