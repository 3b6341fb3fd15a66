#pragma once
// What the fusion auto-tuner (tuner.hpp) measures and models, as pure functions: one iteration's
// sample read from a timeline, the fusion plan it chooses among, and the modelled completion of an
// iteration under a bucket plan (docs/DESIGN.md, "Auto-tuner").
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../timeline.hpp"
#include "buckets.hpp"
#include "cost_model.hpp"
#include "pool.hpp"

namespace gflow::detail {

/// One iteration as one rank saw it.
struct tuner_sample {
  std::vector<double> ready_s;   // per tensor (layout index): seconds since the iteration's first ready()
  std::vector<double> bucket_s;  // per bucket of the plan in use: seconds its exchange took
  double iteration_s = 0;        // first ready() to finish()'s return
};

/// The modelled completion of an iteration (seconds since its first ready()) for a bucket plan:
/// buckets launch in pool order when the ready prefix covers them and are exchanged one after
/// another, bucket b taking cost(its wire bytes).
template <class Cost>
double modelled_completion_by(const plan::pool_plan& pool, std::span<const plan::bucket> buckets, std::span<const double> ready_s,
                              std::size_t wire_bytes_per_element, const Cost& cost) {
  double prefix = 0, end = 0;
  std::size_t pos = 0;
  for (const plan::bucket& b : buckets) {
    for (; pos < b.end_pos; ++pos) prefix = std::max(prefix, ready_s[pool.tensor_at[pos]]);
    end = std::max(end, prefix) + cost(static_cast<double>(b.count * wire_bytes_per_element));
  }
  return end;
}
inline double modelled_completion(const plan::pool_plan& pool, std::span<const plan::bucket> buckets, std::span<const double> ready_s,
                                  std::size_t wire_bytes_per_element, const plan::alpha_beta& cost) {
  return modelled_completion_by(pool, buckets, ready_s, wire_bytes_per_element, [&](double bytes) { return cost.time(bytes); });
}

/// One finished iteration's measurements, read from a timeline: the events of `iteration` from
/// index `from` on (the iteration span, each ready() and each bucket's span).
inline void sample_iteration(const timeline& tl, std::size_t from, std::uint64_t iteration, std::size_t tensors, std::size_t buckets,
                             tuner_sample& out) {
  out.ready_s.assign(tensors, 0.0);
  out.bucket_s.assign(buckets, 0.0);
  out.iteration_s = 0;
  std::int64_t first = 0;
  for (std::size_t e = from; e < tl.size(); ++e)
    if (tl[e].iteration == iteration && tl[e].kind == trace_kind::iteration) {
      first = tl[e].begin_ns;
      out.iteration_s = static_cast<double>(tl[e].end_ns - tl[e].begin_ns) * 1e-9;
    }
  for (std::size_t e = from; e < tl.size(); ++e) {
    const auto& ev = tl[e];
    if (ev.iteration != iteration) continue;
    if (ev.kind == trace_kind::ready && ev.id < tensors) out.ready_s[ev.id] = static_cast<double>(ev.begin_ns - first) * 1e-9;
    else if (ev.kind == trace_kind::bucket && ev.id < buckets) out.bucket_s[ev.id] = static_cast<double>(ev.end_ns - ev.begin_ns) * 1e-9;
  }
}

/// A fusion plan: threshold and first bucket, in wire bytes; with Topology<Hybrid>, its switch
/// (messages of fewer wire bytes go hierarchical; 0: no Hybrid in the composition).
struct fusion_plan {
  std::size_t threshold = 0, first = 0, hybrid_switch = 0;
  static constexpr std::size_t all_ring = 1;  // every message is at least 1 byte
  static constexpr std::size_t all_hierarchical = static_cast<std::size_t>(-1);
  friend bool operator==(const fusion_plan&, const fusion_plan&) = default;
};

}  // namespace gflow::detail
