#pragma once
// A straightforward reference of Sparsifier<OkTopK<d>> (policies/oktopk.hpp): P ranks simulated in
// one thread with std::map lists, brute-force top-k (topk_reference.hpp), a scan of the whole unit
// for the threshold selection, and the same state (thresholds, boundaries) per unit. It shares no
// code with the engine beyond the wire casts and k_for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <gflow/detail/engines/oktopk.hpp>

#include "topk_reference.hpp"

namespace gflow_test {

template <class W>
struct oktopk_reference {
  struct unit_state {
    std::vector<float> local_thr;  // per rank; < 0: not estimated
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
    for (std::size_t i = 0; i < units.size(); ++i) st.push_back({std::vector<float>(static_cast<std::size_t>(ranks), -1.0f), {}});
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
          if (s.size() > cap || 2 * s.size() < k) exact = true;
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
      // reduce each region in rank order
      std::vector<std::map<std::size_t, float>> red(Pz);
      for (std::size_t r = 0; r < Pz; ++r)
        for (std::size_t q = 0; q < Pz; ++q)
          for (auto [i, w] : mine[q])
            if (i >= off + S.bounds[r] && i < off + S.bounds[r + 1]) {
              auto itr = red[r].find(i);
              if (itr == red[r].end()) red[r][i] = k_::to_float(w);
              else itr->second += k_::to_float(w);
            }
      // the global cut, straight from its definition (engines/oktopk/cut.hpp): L = the level
      // (key >> 21) of the k-th largest nonzero |sum| of the unit, every sum above L kept, and
      // k - (those) at L, allotted in rank order, each rank's largest first (ties: lower index);
      // with k or fewer nonzero sums, all of them
      std::vector<std::uint32_t> all;
      for (std::size_t r = 0; r < Pz; ++r)
        for (auto [i, s] : red[r])
          if (k_::magnitude_key(s) != 0) all.push_back(k_::magnitude_key(s));
      std::sort(all.begin(), all.end(), std::greater<>());
      const bool keep_all = all.size() <= k;
      const std::uint32_t L = keep_all ? 0u : all[k - 1] >> 21;
      std::size_t left = keep_all ? all.size() : k;
      for (std::uint32_t key : all)
        if (!keep_all && (key >> 21) > L) --left;
      std::map<std::size_t, W> F;
      std::map<std::size_t, std::pair<std::size_t, float>> err;  // index -> (owner, rounding)
      for (std::size_t r = 0; r < Pz; ++r) {
        std::vector<std::pair<std::uint32_t, std::size_t>> at;  // (key, index) at level L
        for (auto [i, s] : red[r]) {
          const std::uint32_t key = k_::magnitude_key(s);
          if (key != 0 && (key >> 21) == L) at.push_back({key, i});
        }
        std::sort(at.begin(), at.end(), [](auto x, auto y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
        std::set<std::size_t> taken;
        for (std::size_t j = 0; j < at.size() && left > 0; ++j, --left) taken.insert(at[j].second);
        for (auto [i, s] : red[r]) {
          const std::uint32_t key = k_::magnitude_key(s);
          if (key == 0 || (key >> 21) < L || ((key >> 21) == L && !taken.count(i))) continue;
          const W w = k_::wire_cast<W>(k_::sanitize(s));
          F[i] = w;
          const float d = k_::to_float(w);
          err[i] = {r, (std::isfinite(s) && std::isfinite(d)) ? s - d : 0.0f};
        }
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
