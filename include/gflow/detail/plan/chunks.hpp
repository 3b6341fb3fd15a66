#pragma once
// Chunk planning for coarse-grained sparse communication (CSC, GradientFlow (Sun et al.) section 3.2). Pure
// functions, no transport and no memory space:
//
//   chunk_geometry g(pool_elems, chunk_elems);   // the pool cut into equal chunks, last one partial
//   plan_chunk_ranges(g, buckets)                // which chunks become complete with each bucket
//   csc_schedule{warmup, ramp, percent}.selected(iteration, chunks)   // chunks to exchange
//
// Chunk c covers pool elements [c * chunk_elems, min((c + 1) * chunk_elems, pool_elems)). A chunk
// is complete once the ready prefix of the pool reaches its end; buckets are exchanged in pool
// order, so the chunks completed by bucket b are the contiguous range
// [complete(previous bucket end), complete(bucket b end)).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../../error.hpp"
#include "buckets.hpp"

namespace gflow::detail::plan {

/// The pool cut into chunks of `chunk_elems` elements (the last one partial when the chunk size
/// does not divide the pool; a chunk larger than the pool makes one partial chunk).
class chunk_geometry {
 public:
  chunk_geometry() = default;
  chunk_geometry(std::size_t pool_elems, std::size_t chunk_elems) : total_(pool_elems), chunk_(chunk_elems) {
    if (chunk_elems == 0)
      throw invalid_argument("chunk_elems", "the CSC chunk size must be positive (got 0).",
                             "pass a chunk size in elements such as 32768 (the paper's choice).");
    if (pool_elems == 0)
      throw invalid_argument("pool_elems", "the pool to cut into chunks is empty.", "describe at least one non-empty tensor in the layout.");
    count_ = total_ / chunk_ + (total_ % chunk_ != 0);
    if (count_ > std::numeric_limits<std::uint32_t>::max())
      throw invalid_argument("chunk_elems",
                             fmt::format("a chunk size of {} cuts the pool of {}"
                                 " elements into {} chunks; chunk indices are 32-bit.", chunk_elems, pool_elems, count_),
                             fmt::format("use a chunk size of at least {}"
                                 " elements.", pool_elems / std::numeric_limits<std::uint32_t>::max() + 1));
  }

  [[nodiscard]] std::size_t pool_elems() const noexcept { return total_; }
  [[nodiscard]] std::size_t chunk_elems() const noexcept { return chunk_; }
  /// Number of chunks, ceil(pool_elems / chunk_elems).
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t begin(std::size_t c) const noexcept { return c * chunk_; }
  [[nodiscard]] std::size_t end(std::size_t c) const noexcept { return c + 1 == count_ ? total_ : (c + 1) * chunk_; }
  [[nodiscard]] std::size_t size(std::size_t c) const noexcept { return end(c) - begin(c); }
  /// Number of chunks whose end lies at or before pool element `pool_end` (all of them at the end).
  [[nodiscard]] std::size_t complete_before(std::size_t pool_end) const noexcept {
    return pool_end >= total_ ? count_ : pool_end / chunk_;
  }
  /// Elements in the chunks listed (sorted or not): the partial last chunk counts its real size.
  template <class It>
  [[nodiscard]] std::size_t elements(It first, It last) const noexcept {
    std::size_t n = 0;
    for (; first != last; ++first) n += size(static_cast<std::size_t>(*first));
    return n;
  }

 private:
  std::size_t total_ = 0;
  std::size_t chunk_ = 1;
  std::size_t count_ = 0;
};

/// Chunks [first, end) become complete when a bucket is exchanged.
struct chunk_range {
  std::size_t first = 0;
  std::size_t end = 0;
  friend bool operator==(const chunk_range&, const chunk_range&) = default;
};

/// For each bucket (in pool order), the chunks that become complete with it. The ranges are
/// contiguous and cover every chunk exactly once; a bucket that ends inside a chunk completes
/// no chunk that ends after it (that chunk goes with a later bucket).
inline std::vector<chunk_range> plan_chunk_ranges(const chunk_geometry& g, const std::vector<bucket>& buckets) {
  std::vector<chunk_range> out;
  out.reserve(buckets.size());
  std::size_t done = 0;
  std::size_t expect_offset = 0;
  for (const auto& b : buckets) {
    if (b.offset != expect_offset)
      throw invalid_argument("buckets", fmt::format("bucket at pool offset {} does not follow the previous one (expected offset "
                                            "{}).", b.offset, expect_offset),
                             "pass the buckets of plan_buckets, in pool order.");
    expect_offset = b.offset + b.count;
    const std::size_t upto = g.complete_before(expect_offset);
    out.push_back({done, upto});
    done = upto;
  }
  if (expect_offset != g.pool_elems())
    throw invalid_argument("buckets", fmt::format("the buckets cover {} pool elements, the chunk geometry "
                                          "{}.", expect_offset, g.pool_elems()),
                           "plan the chunks and the buckets over the same pool.");
  return out;
}

/// CSC's warm-up (GradientFlow (Sun et al.) section 3.2, "Warm-Up Dense Training"): every chunk for the first
/// `warmup` iterations (dense training), then the selected fraction ramps linearly from 100% down
/// to `percent` over `ramp` iterations, then stays at `percent`:
///
///   iteration i < W:            all chunks                         (W = max(warmup, 1))
///   W <= i < W + ramp:          ceil(chunks * f / 100), f = 100 - (100 - percent) * (i - W + 1) / (ramp + 1)
///   i >= W + ramp:              ceil(chunks * percent / 100)
///
/// Iteration 0 is always dense: the selection comes from the previous iteration's norms and
/// there are none yet. The ramp's R steps lie strictly between 100% and `percent` (with
/// percent 15 and ramp 3: 78.75%, 57.5%, 36.25%, then 15%). Computed in integers, so every rank
/// gets the same count; at least one chunk is always selected.
struct csc_schedule {
  std::uint64_t warmup = 0;
  std::uint64_t ramp = 0;
  unsigned percent = 100;

  /// Largest ramp the integer arithmetic below supports.
  static constexpr std::uint64_t max_ramp = std::uint64_t{1} << 32;

  [[nodiscard]] std::size_t selected(std::uint64_t iteration, std::size_t chunks) const noexcept {
    const std::uint64_t w = warmup == 0 ? 1 : warmup;
    if (iteration < w || chunks == 0) return chunks;
    __extension__ using u128 = unsigned __int128;
    u128 num;  // fraction = num / den
    u128 den;
    const std::uint64_t step = iteration - w + 1;
    if (step <= ramp) {
      num = u128{100} * (ramp + 1) - u128{100u - percent} * step;
      den = u128{100} * (ramp + 1);
    } else {
      num = percent;
      den = 100;
    }
    const u128 k = (u128{chunks} * num + den - 1) / den;
    return k == 0 ? 1 : static_cast<std::size_t>(k);
  }
};

}  // namespace gflow::detail::plan
