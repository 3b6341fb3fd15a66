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
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
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
    read_ranges(max_arrays);
  }
  /// Without an exchanger to check against (the offline re-shard): the header is only read.
  shard_state_file(std::istream& in, std::size_t max_arrays) : r_(in) {
    id_ = read_checkpoint_identity(r_, std::size_t{1} << 24);
    read_ranges(max_arrays);
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
  void read_ranges(std::size_t max_arrays) {
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

// ---- the offline re-shard (gflow::reshard_checkpoints with shard state, the gflow-reshard tool) -------
//
// The new job's shards are not known offline (they follow its bucket plan, topology and size), so
// the new files hold the old state regrouped, not cut to the new shards: each pool element goes to
// new file r mod P' of the lowest old rank r whose shard held it (ranks of different groups that
// hold the same block under Hierarchical<g> or Hybrid keep the same values; the lowest one's are
// taken). The new files are disjoint and cover the pool once, and load_checkpoint with state takes
// each element of any new shard from the file that holds it, as it does from an old set. With
// P' = P the files are rewritten as they were, byte for byte.

/// One shard-<r>.gflow, whole.
struct shard_image {
  checkpoint_identity id;
  std::uint64_t iteration = 0, order_fp = 0;
  std::vector<plan::pool_range> ranges;
  std::vector<std::vector<float>> arrays;
};

inline shard_image read_shard_image(std::istream& in) {
  shard_state_file f(in, std::size_t{1} << 10);
  shard_image img;
  img.id = f.identity();
  img.iteration = f.iteration();
  img.order_fp = f.order_fingerprint();
  img.ranges = f.ranges();
  for (std::size_t a = 0; a < f.arrays(); ++a) img.arrays.push_back(f.next_array());
  f.finish();
  return img;
}

/// The first file (in rank order) whose shard holds a range: its array count is the set's (a rank
/// whose shard was empty may hold no arrays). nullptr when no file holds one (an empty pool).
inline const shard_image* first_with_ranges(const std::vector<const shard_image*>& by_rank) {
  for (const shard_image* s : by_rank)
    if (!s->ranges.empty()) return s;
  return nullptr;
}

/// Validates a set of shard files (one per old rank, any order: of one job and one save, covering
/// the pool) and returns it ordered by rank.
inline std::vector<const shard_image*> order_shard_set(const std::vector<shard_image>& imgs) {
  const auto bad = [](std::string what, std::string_view fix) { throw invalid_argument("shard_states", std::move(what), fix); };
  if (imgs.empty()) bad("no shard state file was given.", "pass the shard-<r>.gflow files of every rank of the job that saved them.");
  const shard_image& a = imgs[0];
  const std::uint32_t P = a.id.size;
  std::vector<const shard_image*> by_rank(P, nullptr);
  for (std::size_t i = 0; i < imgs.size(); ++i) {
    const shard_image& b = imgs[i];
    if (b.id.composition != a.id.composition || b.id.layout_fp != a.id.layout_fp || b.id.tensor_fps != a.id.tensor_fps || b.id.pool_elems != a.id.pool_elems)
      throw mismatch_error("shard_states", fmt::format("shard state file {} of the set was saved by another exchanger than file 0 (composition <{}> vs <{}>, or another layout).",
                                                       i, b.id.composition, a.id.composition),
                           "pass the shard files of one job only.");
    if (b.id.size != P) bad(fmt::format("shard state file {} was saved in a job of {} ranks; file 0 in one of {}.", i, b.id.size, P), "pass the shard files of one job only.");
    if (b.id.rank >= P) bad(fmt::format("shard state file {} names rank {} of {}.", i, b.id.rank, P), "pass intact shard files written by save_checkpoint.");
    if (by_rank[b.id.rank]) bad(fmt::format("rank {} appears twice among the shard state files (file {} and an earlier one).", b.id.rank, i), "pass each rank's shard file once.");
    by_rank[b.id.rank] = &b;
  }
  for (std::uint32_t r = 0; r < P; ++r)
    if (!by_rank[r])
      bad(fmt::format("the set holds {} shard state files of a job of {} ranks; rank {}'s is missing.", imgs.size(), P, r),
          "pass the shard file of every rank: each holds the optimizer state of its own shard.");
  std::vector<plan::pool_range> covered;
  const shard_image* counted = first_with_ranges(by_rank);
  for (std::uint32_t r = 0; r < P; ++r) {
    const shard_image& x = *by_rank[r];
    const shard_image& z = *by_rank[0];
    if (x.iteration != z.iteration)
      throw mismatch_error("iteration", fmt::format("rank 0's shard state is of iteration {}, rank {}'s of iteration {}: the set mixes generations.", z.iteration, r, x.iteration),
                           "pass shard files saved at the same iteration by every rank.");
    if (x.order_fp != z.order_fp || (!x.ranges.empty() && x.arrays.size() != counted->arrays.size()))  // an empty shard may hold no arrays
      throw mismatch_error("shard_states", fmt::format("rank {}'s shard state has another pool order or array count ({}) than rank {}'s ({}).", r, x.arrays.size(),
                                                       counted->id.rank, counted->arrays.size()),
                           "pass shard files saved by one job at one iteration, unmodified.");
    covered = plan::unite_ranges(covered, x.ranges);
  }
  const std::size_t pool = static_cast<std::size_t>(a.id.pool_elems);
  if (pool != 0 && !(covered.size() == 1 && covered[0].begin == 0 && covered[0].end == pool)) {
    std::size_t held = 0;
    for (const plan::pool_range& c : covered) held += c.size();
    bad(fmt::format("the shard state files hold {} of the pool's {} elements.", held, pool), "pass the shard files of every rank of one save (their shards cover the pool).");
  }
  return by_rank;
}

/// Writes new rank new_rank's shard file of a job of new_size ranks from an ordered, validated set.
inline void write_resharded_shards(const std::vector<const shard_image*>& set, std::uint32_t new_rank, std::uint32_t new_size, std::ostream& out) {
  const std::uint32_t P = static_cast<std::uint32_t>(set.size());
  checkpoint_identity id = set[0]->id;
  id.rank = new_rank;
  id.size = new_size;
  struct piece {
    plan::pool_range r;
    const shard_image* from;
    std::size_t at;  // offset in from's packed arrays
  };
  std::vector<piece> pieces;
  if (P == new_size) {
    const shard_image& s = *set[new_rank];
    std::size_t at = 0;
    for (const plan::pool_range& r : s.ranges) {
      pieces.push_back({r, &s, at});
      at += r.size();
    }
  } else {
    std::vector<plan::pool_range> covered;
    for (std::uint32_t r = 0; r < P; ++r) {
      const shard_image& s = *set[r];
      if (r % new_size == new_rank)
        for (const plan::pool_range& p : plan::subtract_ranges(s.ranges, covered)) pieces.push_back({p, &s, plan::packed_offset(s.ranges, p.begin)});
      covered = plan::unite_ranges(covered, s.ranges);
    }
    std::sort(pieces.begin(), pieces.end(), [](const piece& x, const piece& y) { return x.r.begin < y.r.begin; });
  }
  std::vector<plan::pool_range> ranges;
  std::size_t n = 0;
  for (const piece& p : pieces) {
    ranges.push_back(p.r);
    n += p.r.size();
  }
  const shard_image* counted = P == new_size ? set[new_rank] : first_with_ranges(set);  // P' = P: the file as it was
  const std::size_t count = counted ? counted->arrays.size() : 0;
  std::vector<std::vector<float>> arrays(count, std::vector<float>(n));
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    std::size_t at = 0;
    for (const piece& p : pieces) {
      std::copy_n(p.from->arrays[a].begin() + static_cast<std::ptrdiff_t>(p.at), p.r.size(), arrays[a].begin() + static_cast<std::ptrdiff_t>(at));
      at += p.r.size();
    }
  }
  std::vector<std::span<const float>> views(arrays.begin(), arrays.end());
  write_shard_state(out, id, set[0]->iteration, set[0]->order_fp, ranges, views);
}

}  // namespace gflow::detail
