#pragma once
// The cross-rank consistency check an exchanger makes when it is constructed.
//
// Ranks that describe different layouts or compose different policies would issue different
// collectives and hang (or silently mix unrelated gradients). Before anything else, every rank
// all_gathers a small fixed header: the layout fingerprint, the tensor count, the composition
// fingerprint and the run-time options that shape the collective sequence (average, find_unused,
// learn_order, uneven_inputs). When all headers agree that is the whole cost: one all_gather of
// 4 u64 per rank. Exchanger::set_fusion checks its numbers the same way (verify_fusion). Otherwise the ranks exchange what the message needs (rank 0's
// per-tensor fingerprints, every rank's first differing index, descriptions, composition names)
// and EVERY rank raises the same gflow::mismatch_error. Every branch is decided on gathered
// data, so all ranks take the same path and issue the same collectives: no hang.
//
// Control messages travel in host memory. A transport whose buffers live elsewhere (NCCL) or
// that should keep them apart from its gradient traffic (the mock's log) provides
// control_all_gather / control_broadcast on host buffers; the others get all_gather / broadcast.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "../../layout.hpp"
#include "../support/fingerprint.hpp"

namespace gflow::detail {

/// A transport with a control channel: all_gather / broadcast of host buffers next to its
/// data path (device-memory transports need one; host transports use their own collectives).
template <class T>
concept has_control_channel = requires(T& t, const std::uint64_t* send, std::uint64_t* recv, std::size_t n) {
  t.control_all_gather(send, recv, n);
  t.control_broadcast(recv, n, 0);
};
template <class T>
inline constexpr bool control_capable = has_control_channel<T> || std::is_same_v<typename T::memory_space, host_memory>;

template <class T, class E>
void control_all_gather(T& t, const E* send, E* recv, std::size_t n) {
  static_assert(control_capable<T>, "gflow: a device-memory transport must provide control_all_gather(const E*, E*, n) on host buffers.");
  if constexpr (has_control_channel<T>) t.control_all_gather(send, recv, n);
  else t.all_gather(send, recv, n);
}

template <class T, class E>
void control_broadcast(T& t, E* buf, std::size_t n, int root) {
  static_assert(control_capable<T>, "gflow: a device-memory transport must provide control_broadcast(E*, n, root) on host buffers.");
  if constexpr (has_control_channel<T>) t.control_broadcast(buf, n, root);
  else t.broadcast(buf, n, root);
}

/// Every rank's string, in rank order (two all_gathers: lengths, then blocks padded to the longest).
template <class T>
std::vector<std::string> gather_strings(T& t, const std::string& mine) {
  const auto P = static_cast<std::size_t>(t.size());
  const std::uint64_t len = mine.size();
  std::vector<std::uint64_t> lens(P);
  control_all_gather(t, &len, lens.data(), 1);
  const std::size_t L = static_cast<std::size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<std::string> out(P);
  if (L == 0) return out;
  std::vector<std::uint8_t> block(L, 0), all(L * P);
  std::copy(mine.begin(), mine.end(), block.begin());
  control_all_gather(t, block.data(), all.data(), L);
  for (std::size_t r = 0; r < P; ++r)
    out[r].assign(reinterpret_cast<const char*>(all.data() + r * L), static_cast<std::size_t>(std::min<std::uint64_t>(lens[r], L)));
  return out;
}

/// What the exchanger's options fix about the collective sequence.
struct consistency_options {
  bool average = true;
  bool find_unused = false;    // a finish() with missing tensors issues the same collectives on every rank
  bool learn_order = false;    // the first iteration exchanges at finish() and broadcasts an order
  bool uneven_inputs = false;  // every iteration starts with an all_gather of flags
  [[nodiscard]] std::uint64_t flags() const {
    return (average ? 1u : 0u) | (find_unused ? 2u : 0u) | (learn_order ? 4u : 0u) | (uneven_inputs ? 8u : 0u);
  }
};

inline std::string describe_tensor(const Layout& l, std::size_t i) {
  if (i >= l.size()) return fmt::format("no tensor {} (its layout has {} tensors)", i, l.size());
  const tensor_desc& t = l[i];
  std::string shape;
  for (std::size_t d : t.shape) shape += fmt::format("{}{}", (shape.empty() ? "" : "x"), d);
  return fmt::format("'{}' [{}] ({} elements)", t.name, shape, t.numel);
}

inline std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t shown = 16;  // a 1000-rank job should not print 1000 numbers
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < shown; ++i) s += fmt::format("{}{}", (i ? ", " : ""), ranks[i]);
  if (ranks.size() > shown) s += fmt::format(" and {} more", ranks.size() - shown);
  return s;
}

/// The check itself; `composition` is composition_name<Set>(). Collective over t (one small
/// all_gather when everything agrees). Throws mismatch_error on every rank otherwise.
template <class T>
void verify_consistency(T& t, const Layout& layout, const std::string& composition, consistency_options opt) {
  const int P = t.size();
  if (P <= 1) return;  // nothing to compare with
  constexpr std::size_t H = 4;
  enum : std::size_t { k_layout, k_count, k_comp, k_average };
  const std::uint64_t mine[H] = {layout_fingerprint(layout), layout.size(), fnv1a(composition), opt.flags()};
  std::vector<std::uint64_t> all(H * static_cast<std::size_t>(P));
  control_all_gather(t, mine, all.data(), H);
  auto at = [&](int r, std::size_t k) { return all[static_cast<std::size_t>(r) * H + k]; };

  std::vector<int> comp_differs, opt_differs, layout_differs;
  for (int r = 1; r < P; ++r) {
    if (at(r, k_comp) != at(0, k_comp)) comp_differs.push_back(r);
    if (at(r, k_average) != at(0, k_average)) opt_differs.push_back(r);
    if (at(r, k_layout) != at(0, k_layout) || at(r, k_count) != at(0, k_count)) layout_differs.push_back(r);
  }
  if (comp_differs.empty() && opt_differs.empty() && layout_differs.empty()) return;

  // From here on every rank knows the same three lists, so it takes the same branches.
  std::string what, subject;
  if (!comp_differs.empty()) {
    const std::vector<std::string> names = gather_strings(t, composition);
    const int d = comp_differs.front();
    subject = "policies";
    what += fmt::format("the policy compositions differ: rank 0 uses <{}>, rank {} uses <"
            "{}>; ranks whose composition differs from rank 0's: {}. ", names[0], d, names[static_cast<std::size_t>(d)], rank_list(comp_differs));
  }
  if (!opt_differs.empty()) {
    auto opts = [&](int r) {
      const std::uint64_t f = at(r, k_average);
      auto b = [&](std::uint64_t bit) { return (f & bit) ? "true" : "false"; };
      return fmt::format("average {}, find_unused {}, learn_order {}, uneven_inputs {}", b(1), b(2), b(4), b(8));
    };
    const int d = opt_differs.front();
    if (subject.empty()) subject = "exchange_options";
    what += fmt::format("the exchange options differ: rank 0 has {}, rank {} has {}"
            "; ranks whose options differ from rank 0's: {}. ", opts(0), d, opts(d), rank_list(opt_differs));
  }
  if (!layout_differs.empty()) {
    // Rank 0's per-tensor fingerprints, so each rank finds its first differing tensor.
    const auto n0 = static_cast<std::size_t>(at(0, k_count));
    std::vector<std::uint64_t> fp0(n0);
    if (t.rank() == 0)
      for (std::size_t i = 0; i < n0; ++i) fp0[i] = tensor_fingerprint(layout[i]);
    if (n0 > 0) control_broadcast(t, fp0.data(), n0, 0);
    constexpr std::uint64_t none = ~std::uint64_t{0};
    std::uint64_t first = none;
    if (at(t.rank(), k_layout) != at(0, k_layout) || layout.size() != n0) {
      const std::size_t common = std::min(n0, layout.size());
      std::size_t i = 0;
      while (i < common && tensor_fingerprint(layout[i]) == fp0[i]) ++i;
      first = i;  // == common: one layout is a prefix of the other
    }
    std::vector<std::uint64_t> firsts(static_cast<std::size_t>(P));
    control_all_gather(t, &first, firsts.data(), 1);
    // The lowest differing rank by the gathered indices (a fingerprint collision of the whole
    // layout with equal tensors would leave none: then name the layout-fingerprint list alone).
    int d = -1;
    for (int r = 1; r < P && d < 0; ++r)
      if (firsts[static_cast<std::size_t>(r)] != none) d = r;
    if (subject.empty()) subject = "layout";
    what += "the layouts differ";
    if (d >= 0) {
      const auto i = static_cast<std::size_t>(firsts[static_cast<std::size_t>(d)]);
      const std::vector<std::string> desc = gather_strings(t, describe_tensor(layout, i));
      what += fmt::format(" ({} tensors on rank 0, {} on rank "
              "{}); the first difference is tensor {} (layout index, forward order): rank 0 has "
              "{}, rank {} has {}", at(0, k_count), at(d, k_count), d, i, desc[0], d, desc[static_cast<std::size_t>(d)]);
    }
    what += "; ranks whose layout differs from rank 0's: " + rank_list(layout_differs) + ". ";
  }
  what += fmt::format("Raised on rank {} of {}.", t.rank(), P);
  throw mismatch_error(subject, what,
                       "construct the exchanger with the same Layout (names, shapes, order), the same Exchanger<...> policies and the "
                       "same exchange_options on every rank.");
}

/// Exchanger::set_fusion's check: every rank passes the same threshold and first bucket (one
/// all_gather of 2 u64). Collective over t; throws the same mismatch_error on every rank otherwise,
/// before any rank re-plans (different bucket plans would issue different collectives).
template <class T>
void verify_fusion(T& t, std::uint64_t threshold, std::uint64_t first) {
  const int P = t.size();
  if (P <= 1) return;
  const std::uint64_t mine[2] = {threshold, first};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(P));
  control_all_gather(t, mine, all.data(), 2);
  std::vector<int> differs;
  for (int r = 1; r < P; ++r)
    if (all[2 * static_cast<std::size_t>(r)] != all[0] || all[2 * static_cast<std::size_t>(r) + 1] != all[1]) differs.push_back(r);
  if (differs.empty()) return;
  const auto d = static_cast<std::size_t>(differs.front());
  throw mismatch_error("set_fusion",
                       fmt::format("the ranks pass different fusion plans: rank 0 passes threshold_bytes {}, first_bucket_bytes {}; "
                                   "rank {} passes {}, {}; ranks that differ from rank 0: {}. Raised on rank {} of {}.",
                                   all[0], all[1], d, all[2 * d], all[2 * d + 1], rank_list(differs), t.rank(), P),
                       "call set_fusion with the same numbers on every rank (e.g. rank 0's choice, broadcast).");
}

}  // namespace gflow::detail
