#pragma once
// OkTopK's global cut: which of the reduced sums every region's owner all-gathers, so that the
// result holds the unit's k largest |sum| (at a quarter octave's resolution) on every iteration,
// whatever the gradients did since the last one. Pure functions over counts; the engine
// (exchange.hpp) counts its region's sums, sums the counts over ranks with an all_reduce per round
// and calls these; the reference (tests/oktopk_reference.hpp) computes the same cut directly.
//
// Levels: a sum's level is its magnitude key (the bits of |sum|) >> 21, 1024 levels, four per
// octave (the values of one level lie within 2^(1/4) of each other; 1020..1023 hold inf and NaN).
// Zero sums have no level: they are never kept.
//
// The cut {level L, allowance A}: every sum above level L is kept, none below it; of those at
// level L at most A over all ranks, allotted in rank order (rank q takes min(its count at L,
// what ranks 0..q-1 left of A)), each rank taking its largest first (equal magnitudes: lower
// index first). L is the level of the k-th largest |sum| of the unit and A = k - (the sums above
// L), so exactly k sums are kept; with k or fewer nonzero sums, all of them (keep_all).
//
// Finding L: rounds of 32 counts, each summed over ranks by one all_reduce.
//   window: slot 0 counts the levels below lo, slots 1..30 the levels lo .. lo+29, slot 31 the
//     levels from lo+30 up; window_lo centres it on the previous iteration's level. It settles L
//     unless the k-th largest lies in slot 0 or 31 (the window missed).
//   coarse: slot s counts the levels 32s .. 32s+31 (the whole range): the coarse slot C holding
//     the k-th largest;
//   fine: slot s counts level 32C + s; the sums above C were counted by the coarse round.
// First use (no previous level) takes coarse + fine; a missed window takes them after it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace gflow::detail::oktopk_cut {

inline constexpr unsigned level_shift = 21;
inline constexpr std::uint32_t levels = 1024;
inline constexpr std::uint32_t slots = 32;
/// The highest level below inf's (a centre stored as a float threshold must be finite).
inline constexpr std::uint32_t finite_levels = 1020;

constexpr std::uint32_t level_of(std::uint32_t key) noexcept { return key >> level_shift; }
/// The smallest key of a level (a threshold's bits: the engine stores its centre this way).
constexpr std::uint32_t level_floor(std::uint32_t level) noexcept { return level << level_shift; }

enum class round_kind { window, coarse, fine };
struct round {
  round_kind kind;
  std::uint32_t base;  // window: lo; coarse: 0; fine: the coarse slot C
};
/// Slots in [0, 32), or slots when the level is not counted in this round (fine: outside C).
constexpr std::uint32_t slot_of(round r, std::uint32_t level) noexcept {
  switch (r.kind) {
    case round_kind::window: return level < r.base ? 0u : std::min<std::uint32_t>(level - r.base + 1, slots - 1);
    case round_kind::coarse: return level >> 5;
    case round_kind::fine: return (level >> 5) == r.base ? (level & 31u) : slots;
  }
  return slots;
}
/// The window's lo for a previous level c: c in slot 16, the window inside [0, levels).
constexpr std::uint32_t window_lo(std::uint32_t c) noexcept { return std::min<std::uint32_t>(std::max<std::uint32_t>(c, 15) - 15, levels - 31); }

struct cut {
  std::uint32_t level = 0;
  std::uint64_t allowance = std::numeric_limits<std::uint64_t>::max();
  bool keep_all = true;  // k or fewer nonzero sums: every one is kept
};
inline constexpr cut keep_all{};

/// Where the k-th largest lies in a round's summed counts h[32] (above0: the sums above every
/// slot, counted by an earlier round): its slot and the count above that slot, or none (all:
/// k or fewer in total).
struct found {
  std::uint32_t slot = 0;
  std::uint64_t above = 0;
  bool all = true;
};
template <class C>
found find(const C* h, std::uint64_t above0, std::uint64_t k) noexcept {
  std::uint64_t acc = above0;
  for (std::uint32_t s = slots; s-- > 0;) {
    const auto c = static_cast<std::uint64_t>(h[s]);
    if (c > 0 && acc + c >= k) return {s, acc, false};
    acc += c;
  }
  return {};
}

/// A window round's verdict: settled (the cut) or missed (coarse + fine rounds follow).
struct window_verdict {
  cut c;
  bool settled = false;
};
template <class C>
window_verdict settle_window(const C* h, std::uint32_t lo, std::uint64_t k) noexcept {
  const found f = find(h, 0, k);
  if (f.all) return {keep_all, true};  // k or fewer nonzero sums in all, below the window included
  if (f.slot == 0) return {};           // below the window
  if (f.slot == slots - 1 && lo + 30 < levels - 1) return {};  // above it (slot 31 spans several levels)
  return {{lo + f.slot - 1, k - f.above, false}, true};
}
/// The cut after a fine round over coarse slot C (above: the coarse round's count above C).
template <class C>
cut settle_fine(const C* h, std::uint32_t coarse_slot, std::uint64_t above, std::uint64_t k) noexcept {
  const found f = find(h, above, k);
  if (f.all) return keep_all;  // unreachable on consistent counts: the coarse round put the k-th largest in C
  return {coarse_slot * 32 + f.slot, k - f.above, false};
}

/// Rank q's share of the allowance, given every rank's count at the cut's level (in rank
/// order: what ranks before it took is gone).
struct allotter {
  std::uint64_t left;
  explicit allotter(const cut& c) noexcept : left(c.allowance) {}
  std::uint64_t next(std::uint64_t at_level) noexcept {
    const std::uint64_t t = std::min(at_level, left);
    left -= t;
    return t;
  }
};

}  // namespace gflow::detail::oktopk_cut
