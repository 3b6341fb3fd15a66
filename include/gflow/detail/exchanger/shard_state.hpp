#pragma once
// The byte format of a trainer's per-shard state in a checkpoint set (Sharding<ReduceScatter>:
// momentum, Adam's moments, each packed over the rank's shard): shard-<r>.gflow beside the
// exchanger's rank-<r>.gflow (gflow/reshard.hpp's save_checkpoint / load_checkpoint with state).
//
//   header   as a checkpoint's (support/checkpoint.hpp): magic, version, identity (layout,
//            composition, rank, size, pool elements), checksum
//   "SHRD"   u64 iteration, u64 fingerprint of the pool order (every tensor's pool offset),
//            u64 range count, then u64 begin and u64 end per range (the rank's shard in pool
//            elements: ascending, disjoint, none empty),
//            u64 array count, then each array's values (f32), packed in range order
//   trailer  u64 checksum of every byte before it
//
// A loader of any number of ranks takes each element of its new shard from the first file, in
// the order it reads them, whose ranges hold it (shard_state_file below reads one file, an array
// at a time, so a rank holds one old shard's array at most besides its own state).
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

#include "../../error.hpp"
#include "../plan/shards.hpp"
#include "../support/checkpoint.hpp"
#include "../support/fingerprint.hpp"

namespace gflow::detail {

/// Where each tensor sits in the pool: two pools of the same layout and fingerprint hold every
/// tensor at the same offsets, so a pool element means the same gradient element in both.
inline std::uint64_t pool_order_fingerprint(const std::vector<std::size_t>& offsets) noexcept {
  std::uint64_t h = fnv1a_u64(offsets.size());
  for (std::size_t o : offsets) h = fnv1a_u64(o, h);
  return h;
}

/// The non-empty ranges of a shard, in pool order (Exchanger::shard() keeps one per bucket).
inline std::vector<plan::pool_range> shard_pieces(std::span<const plan::pool_range> shard) {
  std::vector<plan::pool_range> out;
  for (const plan::pool_range& r : shard)
    if (r.size() != 0) out.push_back(r);
  return out;
}

inline void write_shard_state(std::ostream& os, const checkpoint_identity& id, std::uint64_t iteration, std::uint64_t order_fp,
                              const std::vector<plan::pool_range>& ranges, std::span<const std::span<const float>> arrays) {
  checkpoint_writer w(os);
  write_checkpoint_header(w, id);
  w.tag(section_tag("SHRD"));
  w.u64(iteration);
  w.u64(order_fp);
  w.u64(ranges.size());
  for (const plan::pool_range& r : ranges) {
    w.u64(r.begin);
    w.u64(r.end);
  }
  w.u64(arrays.size());
  for (std::span<const float> a : arrays) w.elements(a.data(), a.size());
  w.checksum();
  w.finish();
}

/// One shard-<r>.gflow, read up to its arrays at construction (header checked against `mine`,
/// rank and size aside); then next_array() for each array and finish() for the trailer.
class shard_state_file {
 public:
  /// Bounds: at most `max_arrays` arrays (a trainer keeps a few), ranges within the pool.
  shard_state_file(std::istream& in, const checkpoint_identity& mine, const Layout& layout, std::size_t max_arrays) : r_(in) {
    id_ = read_checkpoint_identity(r_, mine.tensor_fps.size() + 1);
    check_checkpoint_identity(id_, mine, layout, false);
    if (id_.pool_elems != mine.pool_elems)
      throw mismatch_error("pool_size", fmt::format("the shard state was saved over a pool of {} elements; this exchanger's has {}.", id_.pool_elems, mine.pool_elems),
                           "load it into an exchanger built with the same layout as the run that saved it.");
    r_.expect_tag(section_tag("SHRD"), "SHRD");
    iteration_ = r_.u64("the iteration");
    order_fp_ = r_.u64("the pool order");
    const std::uint64_t n = r_.u64("the shard's range count");
    if (n > id_.pool_elems) r_.fail("shard_state", fmt::format("the shard state claims {} ranges in a pool of {} elements.", n, id_.pool_elems));
    std::uint64_t at = 0;
    for (std::uint64_t k = 0; k < n; ++k) {
      const std::uint64_t b = r_.u64("a shard range"), e = r_.u64("a shard range");
      if (b < at || e <= b || e > id_.pool_elems)
        r_.fail("shard_state", fmt::format("shard range {} is [{}, {}): ranges must be non-empty, ascending, disjoint and inside the pool of {}.", k, b, e,
                                           id_.pool_elems));
      ranges_.push_back({static_cast<std::size_t>(b), static_cast<std::size_t>(e)});
      elems_ += static_cast<std::size_t>(e - b);
      at = e;
    }
    arrays_ = r_.u64("the array count");
    if (arrays_ > max_arrays) r_.fail("shard_state", fmt::format("the shard state claims {} arrays; at most {} are read.", arrays_, max_arrays));
  }

  [[nodiscard]] const checkpoint_identity& identity() const noexcept { return id_; }
  [[nodiscard]] std::uint64_t iteration() const noexcept { return iteration_; }
  [[nodiscard]] std::uint64_t order_fingerprint() const noexcept { return order_fp_; }
  [[nodiscard]] const std::vector<plan::pool_range>& ranges() const noexcept { return ranges_; }
  [[nodiscard]] std::size_t arrays() const noexcept { return static_cast<std::size_t>(arrays_); }

  /// The next array: one value per element of ranges(), packed.
  std::vector<float> next_array() {
    std::vector<float> v(elems_);
    r_.elements(v.data(), v.size(), "a shard state array");
    return v;
  }
  void finish() { r_.verify_checksum("shard state"); }

 private:
  checkpoint_reader r_;
  checkpoint_identity id_;
  std::uint64_t iteration_ = 0, order_fp_ = 0, arrays_ = 0;
  std::vector<plan::pool_range> ranges_;
  std::size_t elems_ = 0;
};

/// Which elements of a new shard (`mine`, pieces) one old file supplies: runs of (offset in the
/// old file's packed arrays, offset in the new packed state, length), for the elements of `mine`
/// that `old` holds and `filled` does not yet mark; marks them.
struct shard_copy_run {
  std::size_t src = 0, dst = 0, n = 0;
};
inline std::vector<shard_copy_run> take_from(const std::vector<plan::pool_range>& old, const std::vector<plan::pool_range>& mine, std::vector<char>& filled) {
  std::vector<shard_copy_run> runs;
  for (const plan::pool_range& p : plan::intersect_ranges(old, mine)) {
    const std::size_t src = plan::packed_offset(old, p.begin), dst = plan::packed_offset(mine, p.begin);
    for (std::size_t j = 0; j < p.size(); ++j) {
      if (filled[dst + j]) continue;
      filled[dst + j] = 1;
      if (!runs.empty() && runs.back().src + runs.back().n == src + j && runs.back().dst + runs.back().n == dst + j) ++runs.back().n;
      else runs.push_back({src + j, dst + j, 1});
    }
  }
  return runs;
}

}  // namespace gflow::detail
