#pragma once
// Shard planning (pure): how Sharding<ReduceScatter> splits each bucket among the ranks.
// Bucket b of n elements is cut into P blocks in rank order; block q holds n / P elements, one
// more for q < n mod P, so every block is within one element of n / P and the blocks cover the
// bucket exactly once. Rank q owns block q of every bucket. The plan depends only on the bucket
// plan and P, so every rank computes the same one.
#include <cstddef>
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
  int ranks = 1;
  int rank = 0;
  std::vector<std::size_t> counts;  // buckets * ranks: block q of bucket b has counts[b * ranks + q] elements
  std::vector<pool_range> mine;     // per bucket: this rank's block, in pool elements
  std::vector<std::size_t> scratch; // per bucket: where this rank's block starts in a buffer of its blocks, packed
  std::size_t scratch_total = 0;    // the sum of this rank's blocks

  [[nodiscard]] const std::size_t* counts_of(std::size_t b) const noexcept { return counts.data() + b * static_cast<std::size_t>(ranks); }
};

/// Block q of n elements split P ways: its offset from the bucket's start and its size.
[[nodiscard]] inline pool_range block_of(std::size_t n, int P, int q) noexcept {
  const std::size_t p = static_cast<std::size_t>(P), k = static_cast<std::size_t>(q);
  const std::size_t base = n / p, extra = n % p;
  const std::size_t begin = k * base + (k < extra ? k : extra);
  return {begin, begin + base + (k < extra ? 1 : 0)};
}

[[nodiscard]] inline shard_plan plan_shards(const std::vector<bucket>& buckets, int ranks, int rank) {
  if (ranks < 1) throw invalid_argument("ranks", "the group must have at least one rank.", "pass the transport's size().");
  if (rank < 0 || rank >= ranks)
    throw invalid_argument("rank", "the rank is outside the group.", "pass the transport's rank(), in [0, size()).");
  shard_plan s;
  s.ranks = ranks;
  s.rank = rank;
  s.counts.reserve(buckets.size() * static_cast<std::size_t>(ranks));
  s.mine.reserve(buckets.size());
  s.scratch.reserve(buckets.size());
  for (const bucket& b : buckets) {
    for (int q = 0; q < ranks; ++q) s.counts.push_back(block_of(b.count, ranks, q).size());
    const pool_range r = block_of(b.count, ranks, rank);
    s.mine.push_back({b.offset + r.begin, b.offset + r.end});
    s.scratch.push_back(s.scratch_total);
    s.scratch_total += r.size();
  }
  return s;
}

/// Rank q's blocks of every bucket, in pool order (empty blocks left out): its shard under a plan
/// of `buckets` split `ways` ways.
[[nodiscard]] inline std::vector<pool_range> shard_ranges(const std::vector<bucket>& buckets, int ways, int q) {
  std::vector<pool_range> out;
  out.reserve(buckets.size());
  for (const bucket& b : buckets) {
    const pool_range r = block_of(b.count, ways, q);
    if (r.size() != 0) out.push_back({b.offset + r.begin, b.offset + r.end});
  }
  return out;
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
