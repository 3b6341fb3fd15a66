#pragma once
// The transport cost model: alpha + beta * bytes per collective kind, fitted from measurements,
// and the exchange times it predicts (docs/DESIGN.md, "Cost model").
//
// A measurement of a collective at P ranks is (bytes per rank, seconds). Each kind has its
// algorithm's shape, so that the fitted per-message alpha and per-byte beta carry over to
// other P (gTop-k (Shi et al.), Table I, and the flat-tree broadcast it assumes):
//   allreduce   ring            T = 2(P-1) alpha + 2(P-1)/P * n * beta
//   all_gather  (Table I TopK)  T = ceil(log2 P) alpha + (P-1) * n * beta
//   send_recv   one message     T = alpha + n * beta
//   broadcast   flat tree       T = ceil(log2 P) (alpha + n * beta)
// A kind may have two regimes split at a message size (kind_fit). The exchange predictions
// compose these (Dense, Hierarchical, TopK, GTopK, CSC); exchange_model adds each scheme's local
// work (passes over the pool, work per received entry).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "../../error.hpp"
#include "tree.hpp"

namespace gflow::detail::plan {

/// seconds = alpha + beta * bytes.
struct alpha_beta {
  double alpha = 0;  // seconds per message
  double beta = 0;   // seconds per byte
  [[nodiscard]] double time(double bytes) const noexcept { return alpha + beta * bytes; }
};

/// Least-squares fit of seconds = alpha + beta * x over the samples, with alpha, beta >= 0 (a
/// negative intercept is refitted through the origin, a negative slope as a constant).
/// Samples are weighted by 1/seconds^2, i.e. relative error is minimised, so small messages
/// (where alpha dominates) count as much as large ones.
inline alpha_beta fit_alpha_beta(std::span<const double> x, std::span<const double> seconds) {
  if (x.size() != seconds.size() || x.empty())
    throw invalid_argument("samples", fmt::format("fit_alpha_beta needs as many sizes as times, at least one (got {} and "
                                          "{}).", x.size(), seconds.size()),
                           "pass one time per measured size.");
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(seconds[i] > 0) || !(x[i] >= 0))
      throw invalid_argument("samples", fmt::format("fit_alpha_beta: sample {} has a non-positive time or negative size.", i),
                             "pass measured times > 0 and sizes >= 0.");
    const double w = 1.0 / (seconds[i] * seconds[i]);
    sw += w;
    sx += w * x[i];
    sy += w * seconds[i];
    sxx += w * x[i] * x[i];
    sxy += w * x[i] * seconds[i];
  }
  const double det = sw * sxx - sx * sx;
  alpha_beta f;
  if (det > 0) {
    f.beta = (sw * sxy - sx * sy) / det;
    f.alpha = (sy - f.beta * sx) / sw;
  }
  if (!(det > 0) || f.beta < 0) {  // one size, or a falling line: a constant
    f.beta = 0;
    f.alpha = sy / sw;
  } else if (f.alpha < 0) {  // through the origin
    f.alpha = 0;
    f.beta = sxx > 0 ? sxy / sxx : 0;
  }
  return f;
}

enum class collective_kind { allreduce, all_gather, send_recv, broadcast };

[[nodiscard]] inline const char* collective_kind_name(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::send_recv: return "send_recv";
    case collective_kind::broadcast: return "broadcast";
  }
  return "?";
}

/// The (latency terms, byte factor) of a kind at P: T = terms * alpha + factor * n * beta.
struct kind_shape {
  double latency_terms;
  double byte_factor;
  /// The kind's time for a message of `bytes` on the line f: latency_terms alpha + byte_factor bytes beta.
  [[nodiscard]] double time(const alpha_beta& f, double bytes) const noexcept { return latency_terms * f.alpha + byte_factor * bytes * f.beta; }
};
[[nodiscard]] inline kind_shape shape_of(collective_kind k, int P) {
  const double p = P, lg = gtopk_rounds(P);
  switch (k) {
    case collective_kind::allreduce: return {2.0 * (p - 1.0), 2.0 * (p - 1.0) / p};
    case collective_kind::all_gather: return {lg, p - 1.0};
    case collective_kind::send_recv: return {1.0, 1.0};
    case collective_kind::broadcast: return {lg, lg};
  }
  return {1, 1};
}

/// Fits a kind's per-message alpha and per-byte beta from measurements at P ranks
/// (bytes = what each rank contributes: its buffer for allreduce/broadcast, its part for all_gather).
inline alpha_beta fit_kind(collective_kind k, int P, std::span<const double> bytes, std::span<const double> seconds) {
  if (P < 2 && k != collective_kind::send_recv)
    throw invalid_argument("P", fmt::format("a collective's cost is fitted from runs on at least 2 ranks (got {}).", P),
                           "measure on 2 or more ranks.");
  const alpha_beta raw = fit_alpha_beta(bytes, seconds);  // T = a + b n at this P
  const kind_shape s = shape_of(k, P);
  return {raw.alpha / s.latency_terms, raw.beta / s.byte_factor};
}

/// A kind's cost in one or two regimes: messages below `split` bytes (per rank) on one
/// alpha-beta line, the others on a second. Transports change protocol with the message size
/// (Open MPI's tuned collectives switch algorithm at size thresholds; eager vs rendezvous; a
/// token-bucket link passes a burst at line rate and the rest at its rate), which one line over
/// 4 KiB .. 16 MiB cannot follow (on bench/netem.sh: 0.8 ns/B below 256 KiB, 8.4 above).
struct kind_fit {
  alpha_beta small{};  // every message when there is one regime
  alpha_beta large{};
  double split = std::numeric_limits<double>::infinity();

  kind_fit() = default;
  kind_fit(alpha_beta one) noexcept : small(one), large(one) {}  // one regime
  kind_fit(alpha_beta s, alpha_beta l, double at) noexcept : small(s), large(l), split(at) {}
  [[nodiscard]] const alpha_beta& at(double bytes) const noexcept { return bytes < split ? small : large; }
  [[nodiscard]] bool split_in_two() const noexcept { return split != std::numeric_limits<double>::infinity(); }
};

/// fit_kind with a regime change: every split between two measured sizes that leaves at least
/// two sizes on each side is tried, and the one with the smallest worst relative error over the
/// samples is kept if it beats one line's by at least `gain` (2 points of relative error: a
/// split must explain something, not rounding). Returns one regime otherwise.
inline kind_fit fit_kind_regimes(collective_kind k, int P, std::span<const double> bytes, std::span<const double> seconds, double gain = 0.02) {
  const kind_fit one = fit_kind(k, P, bytes, seconds);
  const kind_shape sh = shape_of(k, P);
  auto worst = [&](const kind_fit& f) {
    double w = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) w = std::max(w, std::abs(sh.time(f.at(bytes[i]), bytes[i]) / seconds[i] - 1.0));
    return w;
  };
  std::vector<double> sizes(bytes.begin(), bytes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  kind_fit best = one;
  double best_err = worst(one) - gain;
  for (std::size_t c = 2; c + 2 <= sizes.size(); ++c) {
    const double at = sizes[c];  // sizes[c..] are large
    std::vector<double> xs, ys, xl, yl;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      (bytes[i] < at ? xs : xl).push_back(bytes[i]);
      (bytes[i] < at ? ys : yl).push_back(seconds[i]);
    }
    const kind_fit two(fit_kind(k, P, xs, ys), fit_kind(k, P, xl, yl), at);
    const double e = worst(two);
    if (e < best_err) {
      best = two;
      best_err = e;
    }
  }
  return best;
}

/// The fitted model: one kind_fit per kind.
struct cost_model {
  kind_fit allreduce, all_gather, send_recv, broadcast;

  [[nodiscard]] const kind_fit& of(collective_kind k) const noexcept {
    switch (k) {
      case collective_kind::allreduce: return allreduce;
      case collective_kind::all_gather: return all_gather;
      case collective_kind::send_recv: return send_recv;
      case collective_kind::broadcast: return broadcast;
    }
    return allreduce;
  }
  /// One collective of `bytes` per rank at P ranks.
  [[nodiscard]] double collective(collective_kind k, int P, double bytes) const {
    if (P <= 1) return 0.0;
    return shape_of(k, P).time(of(k).at(bytes), bytes);
  }

  /// Dense: one allreduce per bucket (bytes of each bucket on the wire).
  [[nodiscard]] double dense(int P, std::span<const double> bucket_bytes) const {
    double t = 0;
    for (double b : bucket_bytes) t += collective(collective_kind::allreduce, P, b);
    return t;
  }
  /// Topology<Hierarchical<G>>: reduce inside each group of G (flat tree, as broadcast), ring
  /// allreduce among the P/G group masters, broadcast inside the group; per bucket.
  [[nodiscard]] double hierarchical(int P, int G, std::span<const double> bucket_bytes) const {
    const int g = std::max(1, std::min(G, P));
    const int masters = (P + g - 1) / g;
    double t = 0;
    for (double b : bucket_bytes)
      t += 2.0 * collective(collective_kind::broadcast, g, b) + collective(collective_kind::allreduce, masters, b);
    return t;
  }
  /// TopKAllReduce (Table I): one all_gather of each rank's k (index, value) pairs.
  [[nodiscard]] double topk(int P, std::size_t k, std::size_t pair_bytes) const {
    return collective(collective_kind::all_gather, P, static_cast<double>(k * pair_bytes));
  }
  /// gTopKAllReduce (Table I): ceil(log2 P) rounds of one message of k pairs, then the
  /// flat-tree broadcast of the global k pairs.
  [[nodiscard]] double gtopk(int P, std::size_t k, std::size_t pair_bytes) const {
    if (P <= 1) return 0.0;
    const double lg = gtopk_rounds(P);
    const double msg = static_cast<double>(k * pair_bytes);
    return lg * send_recv.at(msg).time(msg) + collective(collective_kind::broadcast, P, msg);
  }
  /// OkTopK on a threshold iteration, amortised over its re-estimations (policies/oktopk.hpp):
  /// split-and-reduce = an all_to_all of P u64 counts and an all_to_allv of about k (P-1)/P pairs
  /// to the other ranks (P - 1 messages each: (P-1) alpha + bytes beta on the send_recv fit), the
  /// global cut's allreduce of 32 u32 counts (engines/oktopk/cut.hpp: one round while the window
  /// holds; the full-range search's second round on first use and misses is left out), the 24-byte
  /// announcement all_gather and the all_gatherv of the kept blocks (exactly k entries in all: k / P
  /// pairs per rank, an all_gather of that size); every boundary_period iterations an allreduce of
  /// P - 1 u64 is added.
  [[nodiscard]] double oktopk(int P, std::size_t k, std::size_t pair_bytes, double boundary_period = 64) const {
    if (P <= 1) return 0.0;
    const double p = P, kk = static_cast<double>(k), pb = static_cast<double>(pair_bytes), hdr = 24.0;
    auto a2a = [&](double bytes_sent) { return (p - 1.0) * send_recv.at(bytes_sent / (p - 1.0)).alpha + send_recv.at(bytes_sent / (p - 1.0)).beta * bytes_sent; };
    const double split = a2a(8.0 * (p - 1.0)) + a2a(kk * (p - 1.0) / p * pb + hdr * (p - 1.0));
    const double cut = collective(collective_kind::allreduce, P, 32.0 * 4.0);
    const double kept = kk / p * pb + hdr;
    const double gather = collective(collective_kind::all_gather, P, hdr) + collective(collective_kind::all_gather, P, kept);
    const double bounds = collective(collective_kind::allreduce, P, 8.0 * (p - 1.0)) / boundary_period;
    return split + cut + gather + bounds;
  }
  /// CSC: the allreduce of the chunk norms (fp32, one per chunk) and of the selected chunks in
  /// the wire type, one allreduce each (the selected chunks fused into one buffer).
  [[nodiscard]] double csc(int P, std::size_t elements, std::size_t chunk_elems, double fraction, std::size_t wire_bytes) const {
    const double chunks = std::ceil(static_cast<double>(elements) / static_cast<double>(chunk_elems));
    const double selected = std::ceil(chunks * fraction) * static_cast<double>(chunk_elems);
    return collective(collective_kind::allreduce, P, chunks * 4.0) +
           collective(collective_kind::allreduce, P, std::min(selected, static_cast<double>(elements)) * static_cast<double>(wire_bytes));
  }
};

/// An exchange's local work on each rank, per unit, measured on the machine the model is for
/// (`bench/run model` times the engines' own kernels on every rank at once, so shared cores and
/// memory bandwidth are in the figures). Seconds per pool element / per sparse entry.
struct local_costs {
  double average = 0;     // Dense: the average and inf/NaN count of a bucket just reduced (in cache), per element
  double zero = 0;        // TopK / GTopK: writing the pool's zeros before the result goes in, per element
  double accumulate = 0;  // TopK / GTopK: the residual accumulation beyond the selection, per element
  double defer = 0;       // CSC: the history pass over kept-back chunks (defer_chunks), per element
  double entry = 0;       // a received (index, value): validated and decoded twice, scatter-added, averaged
  double union_mark = 0;  // TopK: a received entry's index marked in the union's two-level bitmap
  double union_emit = 0;  // TopK: one element of the union read out of the bitmap, in index order
  double merge_step = 0;  // GTopK: a received message validated and merged (merge_topk), per element of the 2k union
  double ok_select = 0;   // OkTopK: its threshold pass (and 1 / threshold_period of an exact one) minus the sampled selection, per element (either sign)
  double ok_entry = 0;    // OkTopK: a selected entry taken, packed into the split, checked, unpacked and summed by its region's owner
  double ok_result = 0;   // OkTopK: an entry of the result checked, unpacked, decoded into the pool, and in the global threshold's recalibration
  double ok_restore = 0;  // OkTopK: a selected entry the result does not hold, restored into the residual
};

/// Exchange time = communication (cost_model, Table I) + local work (local_costs), per scheme,
/// counting what the engines do (engines/dense.hpp, engines/topk/, engines/csc.hpp):
///   Dense / Hierarchical  one average pass over the pool
///   TopK    residual accumulation, zeros, P messages of k entries, each marked in a bitmap of
///           the pool, and the union (at most min(P k, n): disjoint lists) read out of it
///   GTopK   residual accumulation, zeros, per merge round a received message merged with the
///           rank's list (2k elements), and the broadcast list's k entries
///   OkTopK  its threshold pass beyond the sampled selection, zeros, k selected entries split and
///           reduced, k result entries, and the (P - 1) / P of its selection each rank restores
///   CSC     the history pass over the pool (kept-back chunks; the selected fraction is
///           compacted and scattered instead, at about the same cost per element)
/// The selection itself is left out of the sparse schemes, as bench/run sparse reports them
/// (total minus the selection). On a cluster the per-element terms are per rank and stay as
/// measured for any P; on one shared-memory host they were measured with P ranks sharing it.
struct exchange_model {
  cost_model comm;
  local_costs local;

  [[nodiscard]] double dense(int P, std::span<const double> bucket_bytes, std::size_t elements) const {
    return comm.dense(P, bucket_bytes) + local.average * static_cast<double>(elements);
  }
  [[nodiscard]] double hierarchical(int P, int G, std::span<const double> bucket_bytes, std::size_t elements) const {
    return comm.hierarchical(P, G, bucket_bytes) + local.average * static_cast<double>(elements);
  }
  [[nodiscard]] double topk(int P, std::size_t k, std::size_t pair_bytes, std::size_t elements) const {
    const double n = static_cast<double>(elements), kk = static_cast<double>(k), p = P;
    return comm.topk(P, k, pair_bytes) + (local.accumulate + local.zero) * n + p * kk * (local.entry + local.union_mark) +
           std::min(p * kk, n) * local.union_emit;
  }
  [[nodiscard]] double gtopk(int P, std::size_t k, std::size_t pair_bytes, std::size_t elements) const {
    const double n = static_cast<double>(elements), kk = static_cast<double>(k), lg = P > 1 ? gtopk_rounds(P) : 0.0;
    return comm.gtopk(P, k, pair_bytes) + (local.accumulate + local.zero) * n + lg * 2.0 * kk * local.merge_step + kk * local.entry;
  }
  /// OkTopK on a threshold iteration: each rank selects about k entries (its threshold adapts to
  /// that) and sends each to its region's owner, who sums about k; exactly k entries come back in
  /// the result on every rank (the global cut). With selections that differ between ranks
  /// (independent gradients: the union is about P k) a rank's share of the result is about k / P
  /// of its own k, so it restores (P - 1) / P of them.
  [[nodiscard]] double oktopk(int P, std::size_t k, std::size_t pair_bytes, std::size_t elements) const {
    const double n = static_cast<double>(elements), kk = static_cast<double>(k), p = std::max(P, 1);
    return comm.oktopk(P, k, pair_bytes) + (local.ok_select + local.zero) * n + kk * (local.ok_entry + local.ok_result) +
           (p - 1.0) / p * kk * local.ok_restore;
  }
  [[nodiscard]] double csc(int P, std::size_t elements, std::size_t chunk_elems, double fraction, std::size_t wire_bytes) const {
    return comm.csc(P, elements, chunk_elems, fraction, wire_bytes) + local.defer * static_cast<double>(elements);
  }
};

}  // namespace gflow::detail::plan
