#pragma once
// gTop-k's merge of two sparse lists (gTop-k (Shi et al.), Definition 1) and the residual bookkeeping that
// keeps it lossless (Algorithm 4 line 10 and its completion).
#include <cstddef>
#include <cstdint>

#include "cast.hpp"
#include "topk_select.hpp"

namespace gflow::detail::kernels {
/// Scratch of merge_topk for lists of capacity k: 2k union entries.
template <class I>
struct merge_scratch {
  I* idx;              // 2k
  float* sum;          // 2k
  std::uint32_t* key;  // 2k
};

/// Definition 1 (gTop-k (Shi et al.)) on two index-sorted lists a and b of at most k entries each:
/// values at equal indices are added (in fp32, after decoding; NaN from inf + -inf becomes
/// +inf), and the k largest |sum| are kept (ties: lower index), index-sorted, encoded to W in
/// out. Every other union entry is reported in `records` as (index, sum), and every kept entry
/// whose encoding rounded as (index, sum - float(W(sum))), all in index order: what the
/// merging rank must put back into its residual if the index is in the final global top-k
/// (restore_records_in). Returns the number kept; *records_count receives the records'.
template <class I, class W>
std::size_t merge_topk(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* oi, W* ov,
                       I* ri, float* rv, std::size_t* records_count, merge_scratch<I> s) noexcept {
  // Union, index order.
  std::size_t a = 0, b = 0, u = 0;
  while (a < na || b < nb) {
    if (b == nb || (a < na && ai[a] < bi[b])) {
      s.idx[u] = ai[a];
      s.sum[u++] = to_float(av[a++]);
    } else if (a == na || bi[b] < ai[a]) {
      s.idx[u] = bi[b];
      s.sum[u++] = to_float(bv[b++]);
    } else {
      s.idx[u] = ai[a];
      s.sum[u++] = sanitize(to_float(av[a++]) + to_float(bv[b++]));
    }
  }
  std::size_t nrec = 0;
  std::size_t kept = 0;
  // Keeps union entry j: encodes it, and records its rounding error when the encoding rounded.
  auto keep = [&](std::size_t j) {
    const W w = wire_cast<W>(s.sum[j]);
    oi[kept] = s.idx[j];
    ov[kept++] = w;
    const float err = s.sum[j] - to_float(w);
    if (err != 0.0f && !nonfinite_bit(err)) {
      ri[nrec] = s.idx[j];
      rv[nrec++] = err;
    }
  };
  if (u <= k) {
    for (std::size_t j = 0; j < u; ++j) keep(j);
    *records_count = nrec;
    return kept;
  }
  const threshold t = radix_threshold(s.sum, u, k, s.key);
  std::size_t take = t.take;
  for (std::size_t j = 0; j < u; ++j) {
    const std::uint32_t key = magnitude_key(s.sum[j]);
    if (key > t.key || (key == t.key && take > 0)) {
      if (key == t.key) --take;
      keep(j);
    } else {
      ri[nrec] = s.idx[j];
      rv[nrec++] = s.sum[j];
    }
  }
  *records_count = nrec;
  return kept;
}

/// Algorithm 4 line 10: for each entry of this rank's own list (index-sorted) whose index is
/// not in the final list f (index-sorted), residual[idx] += float(val) * unscale (finite only).
template <class I, class W>
void restore_unselected(float* residual, const I* ai, const W* av, std::size_t na, const I* fi, std::size_t nf, float unscale) noexcept {
  std::size_t p = 0;
  for (std::size_t j = 0; j < na; ++j) {
    while (p < nf && fi[p] < ai[j]) ++p;
    if (p < nf && fi[p] == ai[j]) continue;
    const float v = to_float(av[j]) * unscale;
    if (!nonfinite_bit(v)) residual[static_cast<std::size_t>(ai[j])] += v;
  }
}

/// The completion of line 10 that keeps gTop-k lossless: a merge record (index, value) whose
/// index IS in the final list f goes back into this rank's residual (value * unscale, finite
/// only). Records of indices outside f are dropped here, because their owners restore the
/// whole original values (restore_unselected).
template <class I>
void restore_records_in(float* residual, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale) noexcept {
  std::size_t p = 0;
  for (std::size_t j = 0; j < nr; ++j) {
    while (p < nf && fi[p] < ri[j]) ++p;
    if (p < nf && fi[p] == ri[j]) {
      const float v = rv[j] * unscale;
      if (!nonfinite_bit(v)) residual[static_cast<std::size_t>(ri[j])] += v;
    }
  }
}

}  // namespace gflow::detail::kernels
