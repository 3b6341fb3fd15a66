#pragma once
// Replicas that start equal and stay equal (data parallelism's invariant: every rank holds the
// same parameters and buffers).
//
//   gflow::broadcast_parameters(t, params);          // once at start: every rank takes root's values
//   ...
//   if (step % 100 == 0) gflow::verify_replicas(t, params, layout);   // mismatch_error if they drifted
//
// broadcast_parameters(t, values, root = 0) is the transport's broadcast, after one all_gather of
// (count, root) on the control channel: ranks that pass different counts or roots raise the same
// error on every rank instead of truncating or hanging.
//
// verify_replicas(t, values, layout) fingerprints each tensor of `values` (the layout's tensors
// back to back, in the layout's order; support/fingerprint.hpp's values_fingerprint: bitwise, so
// -0.0 and +0.0 or two NaN payloads differ) and all_gathers one header of 5 u64 per rank: layout fingerprint,
// tensor count, values.size(), layout.total_numel() and a digest of the per-tensor fingerprints.
// When all agree that is the whole cost. Otherwise the ranks all_gather the per-tensor
// fingerprints and EVERY rank raises the same error: invalid_argument('values') when some rank's
// values.size() is not its layout's element count, mismatch_error('layout') when the layouts
// differ, mismatch_error('values') naming the first differing tensor, the ranks that differ in it
// from rank 0 and from the majority. Every branch is decided on gathered data (as the
// exchanger's construction check, exchanger/consistency.hpp): no rank is left in a collective.
//
// Both are collective over t: every rank calls them at the same point. P = 1: nothing to
// compare (no collective; bad arguments are still raised). Device-memory transports: `values` is
// a device pointer; the broadcast is the transport's own, and verify_replicas copies each tensor
// to the host to fingerprint it (cuda/replicas.cuh, brought in by <gflow/cuda/exchanger.cuh>).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"
#include "detail/exchanger/consistency.hpp"
#include "layout.hpp"
#include "detail/support/fingerprint.hpp"
#include "transport/transport.hpp"

namespace gflow {
namespace detail {

/// How verify_replicas fingerprints the tensors of a memory space: `out[i]` gets tensor i's
/// values_fingerprint. Host memory is read in place; device memory is specialised by
/// cuda/replicas.cuh. A space without one leaves `available` false (static_assert below).
template <class Space>
struct replica_reader {
  static constexpr bool available = false;
};

template <>
struct replica_reader<host_memory> {
  static constexpr bool available = true;
  template <class T>
  static void fingerprints(T&, const float* values, const Layout& layout, std::uint64_t* out) {
    std::size_t off = 0;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      out[i] = values_fingerprint(values + off, layout[i].numel);
      off += layout[i].numel;
    }
  }
};

inline std::string raised_on(int rank, int P) { return fmt::format(" Raised on rank {} of {}.", rank, P); }

/// The message for tensor i whose fingerprints differ across ranks: which ranks differ from
/// rank 0, and from the majority (a bit pattern more than half the ranks hold) if there is one.
inline std::string replica_difference(const std::vector<std::uint64_t>& fp, std::size_t n, std::size_t i, int P) {
  auto at = [&](int r) { return fp[static_cast<std::size_t>(r) * n + i]; };
  std::vector<int> from_zero, from_majority;
  for (int r = 1; r < P; ++r)
    if (at(r) != at(0)) from_zero.push_back(r);
  int majority = -1, distinct = 0;  // majority: the lowest rank of the pattern more than P/2 ranks hold
  for (int r = 0; r < P; ++r) {
    int same = 0, lower = 0;
    for (int q = 0; q < P; ++q) {
      same += at(q) == at(r);
      lower += q < r && at(q) == at(r);
    }
    if (lower == 0) ++distinct;
    if (majority < 0 && 2 * same > P) majority = r;
  }
  std::string s = "ranks that differ from rank 0 there: " + rank_list(from_zero) + "; ";
  if (majority < 0) return fmt::format("{}no bit pattern is held by a majority ({} different ones among {} ranks).", s, distinct, P);
  for (int r = 0; r < P; ++r)
    if (at(r) != at(majority)) from_majority.push_back(r);
  const std::size_t held = static_cast<std::size_t>(P) - from_majority.size();
  return fmt::format("{}ranks that differ from the majority ({} of {} ranks, rank 0 "
         "{}): {}.", s, held, P, (at(0) == at(majority) ? "among them" : "not among them"), rank_list(from_majority));
}

/// verify_replicas' body, for a memory space `reader` can read (replicas.hpp's header comment).
template <class reader, class T>
void check_replicas(T& t, std::span<const float> values, const Layout& layout) {
  const int P = t.size();
  const std::size_t n = layout.size();
  const std::uint64_t total = layout.total_numel();
  auto bad_size = [&](int r, std::uint64_t got, std::uint64_t want, std::uint64_t tensors, const std::string& also) {
    return invalid_argument("values",
                            fmt::format("verify_replicas: rank {} passed {} values; its layout holds "
                                "{} elements in {} tensors{}."
                                "{}", r, got, want, tensors, also, detail::raised_on(t.rank(), P)),
                            "pass the span of all the parameters and buffers the layout describes, layout.total_numel() floats in "
                            "the layout's order.");
  };
  const bool size_ok = values.size() == total;
  if (P <= 1) {
    if (!size_ok) throw bad_size(0, values.size(), total, n, "");
    return;
  }
  std::vector<std::uint64_t> fp(n, 0);
  std::uint64_t digest = 0;
  if (size_ok) {
    reader::fingerprints(t, values.data(), layout, fp.data());
    digest = detail::fnv1a(fp.data(), n * sizeof(std::uint64_t));
  }
  constexpr std::size_t H = 5;
  enum : std::size_t { k_layout, k_count, k_values, k_total, k_digest };
  const std::uint64_t mine[H] = {detail::layout_fingerprint(layout), n, values.size(), total, digest};
  std::vector<std::uint64_t> all(H * static_cast<std::size_t>(P));
  detail::control_all_gather(t, mine, all.data(), H);
  auto at = [&](int r, std::size_t k) { return all[static_cast<std::size_t>(r) * H + k]; };

  // From here on every rank decides on the same gathered header.
  std::vector<int> wrong_size, other_layout, other_digest;
  for (int r = 0; r < P; ++r) {
    if (at(r, k_values) != at(r, k_total)) wrong_size.push_back(r);
    if (at(r, k_layout) != at(0, k_layout) || at(r, k_count) != at(0, k_count)) other_layout.push_back(r);
    if (at(r, k_digest) != at(0, k_digest)) other_digest.push_back(r);
  }
  if (!wrong_size.empty()) {
    const int r = wrong_size.front();
    throw bad_size(r, at(r, k_values), at(r, k_total), at(r, k_count), "; ranks whose count is wrong: " + detail::rank_list(wrong_size));
  }
  if (!other_layout.empty())
    throw mismatch_error("layout",
                         fmt::format("verify_replicas: the ranks pass different layouts (layout fingerprint of names, shapes and order; "
                             "{} tensors on rank 0, {}"
                             " on rank {}); ranks whose layout differs from rank 0's: "
                             "{}.{}", at(0, k_count), at(other_layout[0], k_count), other_layout[0], detail::rank_list(other_layout), detail::raised_on(t.rank(), P)),
                         "pass the same Layout on every rank (the one the exchanger was built with, or one of the parameters and buffers).");
  if (other_digest.empty()) return;

  // The replicas differ: every rank's per-tensor fingerprints, to name the first differing tensor.
  std::vector<std::uint64_t> fps(n * static_cast<std::size_t>(P));
  detail::control_all_gather(t, fp.data(), fps.data(), n);
  std::size_t first = n, differing = 0;
  std::vector<int> anywhere;
  for (std::size_t i = 0; i < n; ++i)
    for (int r = 1; r < P; ++r)
      if (fps[static_cast<std::size_t>(r) * n + i] != fps[i]) {
        if (first == n) first = i;
        ++differing;
        break;
      }
  for (int r = 1; r < P; ++r)
    for (std::size_t i = 0; i < n; ++i)
      if (fps[static_cast<std::size_t>(r) * n + i] != fps[i]) {
        anywhere.push_back(r);
        break;
      }
  std::string what = "verify_replicas: the replicas differ";
  if (first == n) {
    // Unreachable (the digest is a function of the fingerprints); kept so that every rank raises.
    what += " (digests only; ranks whose digest differs from rank 0's: " + detail::rank_list(other_digest) + ").";
  } else {
    what += fmt::format(" in {} of {} tensors. The first is tensor {}"
            " (layout index) {}: {}"
            " Ranks whose values differ from rank 0's in any tensor: {}.", differing, n, first, detail::describe_tensor(layout, first), detail::replica_difference(fps, n, first, P), detail::rank_list(anywhere));
  }
  throw mismatch_error("values", what + detail::raised_on(t.rank(), P),
                       "start every rank from the same values (gflow::broadcast_parameters from one rank, parameters and buffers) and "
                       "keep every update deterministic: non-deterministic kernels (atomic adds, autotuned convolutions) let replicas "
                       "drift apart. To go on, broadcast the values of a good rank again.");
}

}  // namespace detail

/// Every rank's `values` become root's, bit for bit (parameters and buffers at start, or after a
/// drift). Collective over t. Device transports: `values` is a device pointer, complete before
/// the call (the broadcast runs on the transport's stream).
template <transport T>
void broadcast_parameters(T& t, std::span<float> values, int root = 0) {
  const int P = t.size();
  auto bad_root = [&](int r) {
    return invalid_argument("root", fmt::format("broadcast_parameters: root {} is outside the group of {} ranks.", r, P),
                            fmt::format("pass the rank whose values every rank takes, in [0, {}); usually 0.", P));
  };
  if (P <= 1) {
    if (root != 0) throw bad_root(root);
    return;
  }
  // Count and root from every rank (the root as a u64: a negative one wraps to a huge value).
  const std::uint64_t mine[2] = {values.size(), static_cast<std::uint64_t>(static_cast<std::int64_t>(root))};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(P));
  detail::control_all_gather(t, mine, all.data(), 2);
  auto count = [&](int r) { return all[2 * static_cast<std::size_t>(r)]; };
  auto root_of = [&](int r) { return static_cast<int>(static_cast<std::int64_t>(all[2 * static_cast<std::size_t>(r) + 1])); };
  for (int r = 0; r < P; ++r)  // the same check, in the same order, on every rank
    if (root_of(r) < 0 || root_of(r) >= P) throw bad_root(root_of(r));
  std::vector<int> other_root, other_count;
  for (int r = 1; r < P; ++r)
    if (root_of(r) != root_of(0)) other_root.push_back(r);
  if (!other_root.empty())
    throw mismatch_error("root",
                         fmt::format("broadcast_parameters: the ranks name different roots: rank 0 names {}, rank "
                             "{} names {}"
                             "; ranks whose root differs from rank 0's: {}.{}", root_of(0), other_root[0], root_of(other_root[0]), detail::rank_list(other_root), detail::raised_on(t.rank(), P)),
                         "pass the same root on every rank.");
  const int rt = root_of(0);
  for (int r = 0; r < P; ++r)
    if (count(r) != count(rt)) other_count.push_back(r);
  if (!other_count.empty())
    throw mismatch_error("values",
                         fmt::format("broadcast_parameters: the ranks pass different element counts: the root, rank {}, passes "
                             "{}, rank {} passes "
                             "{}; ranks whose count differs from the root's: "
                             "{}.{}", rt, count(rt), other_count[0], count(other_count[0]), detail::rank_list(other_count), detail::raised_on(t.rank(), P)),
                         "pass the same parameter vector (the same model, all its parameters and buffers) on every rank.");
  if (!values.empty()) t.broadcast(values.data(), values.size(), rt);
}

/// Raises on every rank when the replicas' `values` (the layout's tensors back to back, in its order) are not
/// bitwise equal; returns otherwise. Collective over t; costs one all_gather of 5 u64 per rank
/// (and a pass over the values) when they are equal.
template <transport T>
void verify_replicas(T& t, std::span<const float> values, const Layout& layout) {
  using reader = detail::replica_reader<typename T::memory_space>;
  static_assert(reader::available,
                "gflow::verify_replicas: this transport works on device memory, and its values are fingerprinted after a copy to the "
                "host. Compile the translation unit with nvcc (a .cu file) and include <gflow/cuda/exchanger.cuh>.");
  if constexpr (reader::available) detail::check_replicas<reader>(t, values, layout);
}

}  // namespace gflow
