#pragma once
// Shard planning (pure): how Sharding<ReduceScatter> splits each bucket among the ranks.
// Each bucket has a number of ways w (the topology's choice: P for Ring, g for Hierarchical<g>,
// either for Hybrid by the bucket's size). Bucket b of n elements is cut into w blocks in rank
// order; block q holds n / w elements, one more for q < n mod w, so every block is within one
// element of n / w and the blocks cover the bucket exactly once. The ranks split into aligned
// sets of w (ranks [k w, (k + 1) w)); world rank r owns block r mod w, and the P / w sets hold
// the same blocks (each allreduced across them). The plan depends only on the bucket plan, the
// ways and the rank, so every rank computes the same one.
#include <cstddef>
#include <span>
#include <vector>

#include "../../error.hpp"
#include "buckets.hpp"

namespace gflow::detail::plan {

/// A range of pool elements, [begin, end).
struct pool_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  friend bool operator==(const pool_range&, const pool_range&) = default;
};

struct shard_plan {
  int rank = 0;                      // the world rank the plan is for
  std::vector<int> ways;             // per bucket: the ranks it is split among
  std::vector<std::size_t> counts;   // per bucket, ways[b] entries from counts_at[b]: block q has counts[counts_at[b] + q] elements
  std::vector<std::size_t> counts_at;
  std::vector<pool_range> mine;      // per bucket: this rank's block, in pool elements
  std::vector<std::size_t> scratch;  // per bucket: where this rank's block starts in a buffer of its blocks, packed
  std::size_t scratch_total = 0;     // the sum of this rank's blocks

  [[nodiscard]] const std::size_t* counts_of(std::size_t b) const noexcept { return counts.data() + counts_at[b]; }
  /// True when this rank's set of ways[b] ranks is the first (ranks [0, ways[b])): of the P / w
  /// ranks that hold its block of bucket b, it is the one that counts it once for the job.
  [[nodiscard]] bool first_holder(std::size_t b) const noexcept { return rank < ways[b]; }
  /// The ways when every bucket has the same (0 when they differ, as Hybrid's may).
  [[nodiscard]] int uniform_ways() const noexcept {
    for (int w : ways)
      if (w != ways.front()) return 0;
    return ways.empty() ? 1 : ways.front();
  }
};

/// Block q of n elements split P ways: its offset from the bucket's start and its size.
[[nodiscard]] inline pool_range block_of(std::size_t n, int P, int q) noexcept {
  const std::size_t p = static_cast<std::size_t>(P), k = static_cast<std::size_t>(q);
  const std::size_t base = n / p, extra = n % p;
  const std::size_t begin = k * base + (k < extra ? k : extra);
  return {begin, begin + base + (k < extra ? 1 : 0)};
}

/// The plan of `buckets`, bucket b split ways[b] ways, for world rank `rank`.
[[nodiscard]] inline shard_plan plan_shards(const std::vector<bucket>& buckets, std::span<const int> ways, int rank) {
  if (ways.size() != buckets.size())
    throw invalid_argument("ways", fmt::format("{} ways for {} buckets.", ways.size(), buckets.size()), "pass one number of ways per bucket.");
  for (int w : ways)
    if (w < 1) throw invalid_argument("ways", "a bucket must be split among at least one rank.", "pass the topology's shard_ways for each bucket.");
  if (rank < 0) throw invalid_argument("rank", "the rank is negative.", "pass the transport's rank(), in [0, size()).");
  shard_plan s;
  s.rank = rank;
  s.ways.assign(ways.begin(), ways.end());
  s.counts_at.reserve(buckets.size());
  s.mine.reserve(buckets.size());
  s.scratch.reserve(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const int w = ways[b];
    s.counts_at.push_back(s.counts.size());
    for (int q = 0; q < w; ++q) s.counts.push_back(block_of(buckets[b].count, w, q).size());
    const pool_range r = block_of(buckets[b].count, w, rank % w);
    s.mine.push_back({buckets[b].offset + r.begin, buckets[b].offset + r.end});
    s.scratch.push_back(s.scratch_total);
    s.scratch_total += r.size();
  }
  return s;
}

/// Every bucket split `ways` ways (Ring: P; Hierarchical<g>: g), for rank `rank` of those ways.
[[nodiscard]] inline shard_plan plan_shards(const std::vector<bucket>& buckets, int ways, int rank) {
  if (ways < 1) throw invalid_argument("ranks", "the group must have at least one rank.", "pass the transport's size().");
  if (rank < 0 || rank >= ways)
    throw invalid_argument("rank", "the rank is outside the group.", "pass the transport's rank(), in [0, size()).");
  const std::vector<int> w(buckets.size(), ways);
  return plan_shards(buckets, w, rank);
}

/// Rank s's blocks, bucket b split ways[b] ways, of the buckets where s is in rank r's aligned set
/// of ways[b] (those r takes from s when state follows a re-plan), in pool order, empty blocks left
/// out.
[[nodiscard]] inline std::vector<pool_range> held_ranges(const std::vector<bucket>& buckets, std::span<const int> ways, int s, int r) {
  std::vector<pool_range> out;
  out.reserve(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const int w = ways[b];
    if (s / w != r / w) continue;
    const pool_range g = block_of(buckets[b].count, w, s % w);
    if (g.size() != 0) out.push_back({buckets[b].offset + g.begin, buckets[b].offset + g.end});
  }
  return out;
}

/// World rank r's blocks of every bucket, bucket b split ways[b] ways, in pool order (empty blocks
/// left out): its shard under that plan.
[[nodiscard]] inline std::vector<pool_range> shard_ranges(const std::vector<bucket>& buckets, std::span<const int> ways, int r) {
  return held_ranges(buckets, ways, r, r);
}

/// The elements two ascending lists of disjoint ranges share, ascending.
[[nodiscard]] inline std::vector<pool_range> intersect_ranges(const std::vector<pool_range>& a, const std::vector<pool_range>& b) {
  std::vector<pool_range> out;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::size_t lo = a[i].begin > b[j].begin ? a[i].begin : b[j].begin;
    const std::size_t hi = a[i].end < b[j].end ? a[i].end : b[j].end;
    if (lo < hi) out.push_back({lo, hi});
    if (a[i].end < b[j].end) ++i;
    else ++j;
  }
  return out;
}

/// The elements of `a` that `b` does not hold, ascending (both ascending lists of disjoint ranges).
[[nodiscard]] inline std::vector<pool_range> subtract_ranges(const std::vector<pool_range>& a, const std::vector<pool_range>& b) {
  std::vector<pool_range> out;
  std::size_t j = 0;
  for (const pool_range& r : a) {
    while (j < b.size() && b[j].end <= r.begin) ++j;
    std::size_t x = r.begin;
    for (std::size_t k = j; x < r.end && k < b.size() && b[k].begin < r.end; ++k) {
      if (b[k].begin > x) out.push_back({x, b[k].begin});
      if (b[k].end > x) x = b[k].end;
    }
    if (x < r.end) out.push_back({x, r.end});
  }
  return out;
}

/// The elements `a` or `b` holds, ascending, touching ranges joined (both ascending lists of
/// disjoint ranges).
[[nodiscard]] inline std::vector<pool_range> unite_ranges(const std::vector<pool_range>& a, const std::vector<pool_range>& b) {
  std::vector<pool_range> out;
  std::size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const pool_range r = j == b.size() || (i < a.size() && a[i].begin <= b[j].begin) ? a[i++] : b[j++];
    if (!out.empty() && r.begin <= out.back().end) {
      if (r.end > out.back().end) out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

/// Where pool element x sits in a buffer that packs `ranges` (ascending, disjoint) back to back; x
/// must lie in one of them.
[[nodiscard]] inline std::size_t packed_offset(const std::vector<pool_range>& ranges, std::size_t x) {
  std::size_t at = 0;
  for (const pool_range& r : ranges) {
    if (x < r.end) return at + (x - r.begin);
    at += r.size();
  }
  return at;
}

}  // namespace gflow::detail::plan
