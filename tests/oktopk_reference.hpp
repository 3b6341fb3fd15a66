#pragma once
// A straightforward reference of Sparsifier<OkTopK<d>> (policies/oktopk.hpp): P ranks simulated in
// one thread with std::map lists, brute-force top-k (topk_reference.hpp), a scan of the whole unit
// for the threshold selection, and the same state (thresholds, boundaries) per unit. It shares no
// code with the engine beyond the wire casts and k_for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include <gflow/detail/engines/oktopk.hpp>

#include "topk_reference.hpp"

namespace gflow_test {

template <class W>
struct oktopk_reference {
  struct unit_state {
    std::vector<float> local_thr;  // per rank; < 0: not estimated
    float global_thr = -1.0f;
    std::vector<std::uint64_t> bounds;
  };
  int P;
  bool average;
  gflow::detail::oktopk_params prm;
  std::vector<std::pair<std::size_t, std::size_t>> units;
  std::vector<unit_state> st;
  std::vector<std::vector<float>> res;  // per rank
  std::vector<float> result;
  std::vector<std::uint64_t> exchanged;
  static constexpr bool narrow = sizeof(W) < sizeof(float);

  oktopk_reference(int ranks, bool avg, gflow::detail::oktopk_params p, std::vector<std::pair<std::size_t, std::size_t>> u, std::size_t n)
      : P(ranks), average(avg), prm(p), units(std::move(u)), res(static_cast<std::size_t>(ranks), std::vector<float>(n, 0.0f)), result(n) {
    for (std::size_t i = 0; i < units.size(); ++i) st.push_back({std::vector<float>(static_cast<std::size_t>(ranks), -1.0f), -1.0f, {}});
  }

  static float minmag(const std::vector<float>& v) {
    float t = std::numeric_limits<float>::infinity();
    for (float x : v) t = std::min(t, std::fabs(x));
    return (!v.empty() && std::isfinite(t) && t > 0.0f) ? t : -1.0f;
  }

  void step(const std::vector<std::vector<float>>& g, double density, std::uint64_t it) {
    const float Pf = static_cast<float>(P);
    const float scale = (narrow && average) ? 1.0f / Pf : 1.0f;
    const float unscale = (narrow && average) ? Pf : 1.0f;
    const auto Pz = static_cast<std::size_t>(P);
    exchanged.clear();
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < res[q].size(); ++i) res[q][i] = g[q][i] + res[q][i];  // G
    for (std::size_t u = 0; u < units.size(); ++u) {
      const auto [off, n] = units[u];
      auto& S = st[u];
      const std::size_t k = gflow::detail::plan::k_for(density, n);
      const std::size_t cap = std::max<std::size_t>(k, static_cast<std::size_t>(std::ceil(prm.capacity * static_cast<double>(k))));
      // local selection
      std::vector<std::map<std::size_t, W>> mine(Pz);
      std::vector<std::vector<std::size_t>> sel(Pz);
      for (std::size_t q = 0; q < Pz; ++q) {
        const std::vector<float>& G = res[q];
        bool exact = S.local_thr[q] < 0.0f || it % prm.threshold_period == 0;
        std::vector<std::size_t> s;
        if (!exact) {
          const std::uint32_t tk = std::max<std::uint32_t>(k_::magnitude_key(S.local_thr[q]), 1u);
          for (std::size_t i = 0; i < n; ++i)
            if (k_::magnitude_key(G[off + i]) >= tk) s.push_back(off + i);
          if (s.size() > cap) exact = true;
        }
        if (exact) {
          s.clear();
          for (std::size_t p : brute_topk(G.data() + off, n, k)) s.push_back(off + p);
          std::vector<float> v;
          for (std::size_t i : s) v.push_back(G[i]);
          S.local_thr[q] = minmag(v);
        } else {
          const auto a = static_cast<float>(prm.local_adapt);
          if (3 * s.size() < 2 * k) S.local_thr[q] /= a;
          else if (4 * s.size() > 5 * k) S.local_thr[q] *= a;
        }
        bool all_nf = !s.empty() && s.size() < n;
        for (std::size_t i : s) all_nf = all_nf && !std::isfinite(G[i]);
        for (std::size_t i : s) {
          const W w = k_::wire_cast<W>(k_::sanitize(G[i] * scale));
          mine[q][i] = w;
          const float d = k_::to_float(w);
          res[q][i] = std::isfinite(d) ? G[i] - d * unscale : 0.0f;
        }
        if (all_nf)
          for (std::size_t i = off; i < off + n; ++i)
            if (!std::isfinite(res[q][i])) res[q][i] = 0.0f;
        sel[q] = s;
      }
      // boundaries
      if (S.bounds.size() != Pz + 1 || it % prm.boundary_period == 0) {
        std::vector<std::uint64_t> sum(Pz, 0);
        for (std::size_t q = 0; q < Pz; ++q) {
          const std::size_t chunk = sel[q].size() / Pz;
          for (std::size_t i = 1; i < Pz; ++i) sum[i] += chunk > 0 ? sel[q][chunk * i] - off : std::uint64_t(n) * i / Pz;
        }
        S.bounds.assign(Pz + 1, 0);
        S.bounds[Pz] = n;
        for (std::size_t i = 1; i < Pz; ++i) S.bounds[i] = std::min<std::uint64_t>(std::max<std::uint64_t>(sum[i] / Pz, S.bounds[i - 1]), n);
      }
      // reduce each region in rank order, keep, encode
      const bool gexact = S.global_thr < 0.0f || it % prm.threshold_period == 0;
      std::map<std::size_t, W> F;
      std::map<std::size_t, std::pair<std::size_t, float>> err;  // index -> (owner, rounding)
      for (std::size_t r = 0; r < Pz; ++r) {
        std::map<std::size_t, float> red;
        for (std::size_t q = 0; q < Pz; ++q)
          for (auto [i, w] : mine[q])
            if (i >= off + S.bounds[r] && i < off + S.bounds[r + 1]) {
              auto itr = red.find(i);
              if (itr == red.end()) red[i] = k_::to_float(w);
              else itr->second += k_::to_float(w);
            }
        for (auto [i, s] : red) {
          if (!gexact && k_::magnitude_key(s) < std::max<std::uint32_t>(k_::magnitude_key(S.global_thr), 1u)) continue;
          const W w = k_::wire_cast<W>(k_::sanitize(s));
          F[i] = w;
          const float d = k_::to_float(w);
          err[i] = {r, (std::isfinite(s) && std::isfinite(d)) ? s - d : 0.0f};
        }
      }
      if (gexact) {
        if (F.size() > k) {
          std::vector<std::size_t> idx;
          std::vector<float> v;
          for (auto [i, w] : F) {
            idx.push_back(i);
            v.push_back(k_::to_float(w));
          }
          std::map<std::size_t, W> top;
          for (std::size_t p : brute_topk(v.data(), v.size(), k)) top[idx[p]] = F[idx[p]];
          F = top;
        }
        std::vector<float> v;
        for (auto [i, w] : F) v.push_back(k_::to_float(w));
        S.global_thr = minmag(v);
      } else if (3 * F.size() > 4 * k) {  // the k-th largest |value| of the result (sorted here)
        std::vector<float> mag;
        for (auto [i, w] : F) mag.push_back(std::fabs(k_::to_float(w)));
        std::sort(mag.begin(), mag.end(), [](float x, float y) { return x > y; });
        S.global_thr = mag[k - 1];
      } else if (3 * F.size() < 2 * k) {
        S.global_thr /= static_cast<float>(prm.global_adapt);
      }
      // apply and residuals
      const float post = (!narrow && average) ? 1.0f / Pf : 1.0f;
      std::fill(result.begin() + static_cast<std::ptrdiff_t>(off), result.begin() + static_cast<std::ptrdiff_t>(off + n), 0.0f);
      for (auto [i, w] : F) {
        result[i] = k_::to_float(w) * post;
        exchanged.push_back(i);
      }
      for (std::size_t q = 0; q < Pz; ++q)
        for (auto [i, w] : mine[q])
          if (!F.count(i)) {
            const float v = k_::to_float(w) * unscale;
            if (std::isfinite(v)) res[q][i] += v;
          }
      for (auto [i, w] : F) {
        const auto [owner, e] = err[i];
        const float v = e * unscale;
        if (e != 0.0f && std::isfinite(v)) res[owner][i] += v;
      }
    }
  }
};

}  // namespace gflow_test
