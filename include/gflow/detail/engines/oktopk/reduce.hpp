#pragma once
// OkTopK's region reduction (split-and-reduce, engines/oktopk/exchange.hpp): the entries every
// rank sent for this rank's region, summed by index. Host code for both memory spaces, on the
// host copies of the received blocks.
//
// What it computes: the blocks lie one after another in rank order, each increasing in index; the
// sum of an index is its first entry, then each later one added in fp32 in rank order (block
// order): what a P-way merge by (index, block) computes, bit for bit (tests/engines/test_oktopk.cpp
// checks it against that merge, NaN payloads and signed zeros included).
//
// How: a stable least-significant-digit radix sort of the entries by offset in the region
// (index - lo; 11 bits a pass, as many passes as the region's size needs: 2 up to 2^22 elements, 3
// up to 2^33), which keeps each index's entries in block order, then one scan that sums each run.
// An entry is sorted as one u64, offset << 32 | position, where both fit 32 bits (regions of up
// to 2^32 elements and up to 2^32 entries), else as a pair. About 9–10 ns an entry at any P (320k entries, resnet50's
// regions at d = 0.01, one core), where a heap merge took 14, 17, 21, 28 ns at P = 2, 4, 8, 16.
// A list already increasing (one rank, or entries from one block only) is copied as it is.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../../kernels/cast_scalar.hpp"

namespace gflow::detail {

/// Scratch of reduce_by_index: reserved for the most entries a region receives, so that a call
/// allocates nothing.
struct region_reduce_scratch {
  static constexpr unsigned bits = 11;
  static constexpr std::size_t radix = std::size_t{1} << bits;
  struct wide_entry {
    std::uint64_t key;
    std::size_t pos;
  };
  std::vector<std::uint64_t> packed[2];  // offset << 32 | position, this pass's order and the next
  std::vector<wide_entry> wide[2];       // regions of over 2^32 elements, or over 2^32 entries
  std::vector<std::size_t> hist;         // every pass's digit counts
  void reserve(std::size_t m, bool wide_regions) {
    for (int b = 0; b < 2; ++b) {
      packed[b].reserve(m);
      if (wide_regions) wide[b].reserve(m);
    }
    hist.reserve((64 + bits - 1) / bits * radix);
  }
};

namespace oktopk_reduce {

/// Stable LSD radix sort of b[0][0..m) by digit(e, pass) (pass 0 the least significant); returns
/// the buffer that holds the result.
template <class E, class Digit>
const E* lsd_sort(std::vector<E> (&b)[2], std::size_t m, unsigned passes, std::vector<std::size_t>& hist, Digit digit) {
  constexpr std::size_t R = region_reduce_scratch::radix;
  hist.assign(passes * R, 0);
  for (std::size_t j = 0; j < m; ++j)
    for (unsigned p = 0; p < passes; ++p) ++hist[p * R + digit(b[0][j], p)];
  for (unsigned p = 0; p < passes; ++p) {
    std::size_t sum = 0;
    for (std::size_t d = 0; d < R; ++d) hist[p * R + d] = std::exchange(sum, sum + hist[p * R + d]);
  }
  int cur = 0;
  for (unsigned p = 0; p < passes; ++p) {
    const E* x = b[cur].data();
    E* y = b[cur ^ 1].data();
    std::size_t* h = hist.data() + p * R;
    for (std::size_t j = 0; j < m; ++j) y[h[digit(x[j], p)]++] = x[j];  // stable: equal digits keep their order
    cur ^= 1;
  }
  return b[cur].data();
}

}  // namespace oktopk_reduce

/// out = (index, sum) of the m received entries idx[0..m) / val[0..m) (blocks in rank order, each
/// increasing; every index in [lo, hi), checked before), increasing in index.
template <class I, class W>
void reduce_by_index(const I* idx, const W* val, std::size_t m, std::uint64_t lo, std::uint64_t hi, region_reduce_scratch& s,
                     std::vector<std::pair<std::uint64_t, float>>& out) {
  using S = region_reduce_scratch;
  out.clear();
  if (m == 0) return;
  if (std::adjacent_find(idx, idx + m, [](I a, I b) { return a >= b; }) == idx + m) {  // increasing already (one rank, or one block)
    for (std::size_t j = 0; j < m; ++j) out.push_back({static_cast<std::uint64_t>(idx[j]), kernels::to_float(val[j])});
    return;
  }
  const std::uint64_t last = hi > lo ? hi - lo - 1 : 0;  // the largest offset
  const unsigned passes = std::max(1u, (static_cast<unsigned>(std::bit_width(last)) + S::bits - 1) / S::bits);
  std::uint64_t at = 0;  // out.back()'s offset (out non-empty)
  auto emit = [&](std::uint64_t off, std::size_t pos) {
    const float v = kernels::to_float(val[pos]);
    if (!out.empty() && at == off) {
      out.back().second += v;
    } else {
      out.push_back({off + lo, v});
      at = off;
    }
  };
  if (last < (std::uint64_t{1} << 32) && m <= (std::uint64_t{1} << 32)) {
    for (auto& b : s.packed) b.resize(m);
    for (std::size_t j = 0; j < m; ++j) s.packed[0][j] = (static_cast<std::uint64_t>(idx[j]) - lo) << 32 | j;
    const std::uint64_t* e = oktopk_reduce::lsd_sort(s.packed, m, passes, s.hist,
                                                     [](std::uint64_t x, unsigned p) { return static_cast<std::size_t>(x >> (32 + p * S::bits)) & (S::radix - 1); });
    for (std::size_t j = 0; j < m; ++j) emit(e[j] >> 32, static_cast<std::size_t>(e[j] & 0xffffffffu));
  } else {
    for (auto& b : s.wide) b.resize(m);
    for (std::size_t j = 0; j < m; ++j) s.wide[0][j] = {static_cast<std::uint64_t>(idx[j]) - lo, j};
    const S::wide_entry* e = oktopk_reduce::lsd_sort(s.wide, m, passes, s.hist,
                                                     [](const S::wide_entry& x, unsigned p) { return static_cast<std::size_t>(x.key >> (p * S::bits)) & (S::radix - 1); });
    for (std::size_t j = 0; j < m; ++j) emit(e[j].key, e[j].pos);
  }
}

}  // namespace gflow::detail
