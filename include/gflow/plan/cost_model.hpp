#pragma once
// The transport cost model: alpha + beta * bytes per collective kind, fitted from measurements,
// and the exchange times it predicts (docs/DESIGN.md, "Cost model").
//
// A measurement of a collective at P ranks is (bytes per rank, seconds). Each kind has its
// algorithm's shape, so that the fitted per-message alpha and per-byte beta carry over to
// other P (paper 003, Table I, and the flat-tree broadcast it assumes):
//   allreduce   ring            T = 2(P-1) alpha + 2(P-1)/P * n * beta
//   all_gather  (Table I TopK)  T = ceil(log2 P) alpha + (P-1) * n * beta
//   send_recv   one message     T = alpha + n * beta
//   broadcast   flat tree       T = ceil(log2 P) (alpha + n * beta)
// The exchange predictions compose these (Dense, Hierarchical, TopK, GTopK, CSC).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "../error.hpp"
#include "tree.hpp"

namespace gflow::plan {

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
    throw invalid_argument("samples", "fit_alpha_beta needs as many sizes as times, at least one (got " + std::to_string(x.size()) + " and " +
                                          std::to_string(seconds.size()) + ").",
                           "pass one time per measured size.");
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(seconds[i] > 0) || !(x[i] >= 0))
      throw invalid_argument("samples", "fit_alpha_beta: sample " + std::to_string(i) + " has a non-positive time or negative size.",
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
    throw invalid_argument("P", "a collective's cost is fitted from runs on at least 2 ranks (got " + std::to_string(P) + ").",
                           "measure on 2 or more ranks.");
  const alpha_beta raw = fit_alpha_beta(bytes, seconds);  // T = a + b n at this P
  const kind_shape s = shape_of(k, P);
  return {raw.alpha / s.latency_terms, raw.beta / s.byte_factor};
}

/// The fitted model: one (alpha, beta) per kind.
struct cost_model {
  alpha_beta allreduce, all_gather, send_recv, broadcast;

  [[nodiscard]] const alpha_beta& of(collective_kind k) const noexcept {
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
    const kind_shape s = shape_of(k, P);
    const alpha_beta& f = of(k);
    return s.latency_terms * f.alpha + s.byte_factor * bytes * f.beta;
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
    return lg * send_recv.time(msg) + collective(collective_kind::broadcast, P, msg);
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

}  // namespace gflow::plan
