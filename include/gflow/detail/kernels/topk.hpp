#pragma once
// Host kernels of the Top-k sparsifiers (engines/topk.hpp): the references for the CUDA twins
// in include/gflow/detail/cuda/topk.cuh, which produce the same selections and the same bits. This
// header gives all of them; the parts: topk_select.hpp (keys, the radix select, select_topk,
// accumulate_residual), topk_sampled.hpp (the one-pass selection), topk_merge.hpp (gTop-k's
// merge and its residual bookkeeping), and here what moves values by index and the message check.
//
//   accumulate_residual(g, res, n)            G = g + res, written to both (res = G until selection)
//   radix_threshold(v, n, k, scratch)          the k-th largest |v| as a key, and how many of the
//                                              elements equal to it are taken (lowest indices first)
//   select_topk(v, n, k, base, out, scratch)   exact top-k by |v|, ties to the lower index,
//                                              indices (base + position) in increasing order
//   accumulate_select_topk(g, res, n, k, base, out, ws)
//                                              res = G = g + res (g only read), then exactly what
//                                              select_topk(G) selects, in about one pass: a sampled
//                                              threshold, one gathering pass, a radix select among
//                                              the candidates, the full selection as the fallback
//                                              (host only: no CUDA twin yet, see below)
//   select_topk_sampled(v, n, k, base, out, ws) the same without the accumulation
//   accumulate_into_residual(g, res, n)         res = g + res, g only read (host only)
//   take_selected(G, res, idx, count, out, s)  wire values W(G * s); residual keeps G - W / s
//                                              (G and res may be the same array)
//   clear_nonfinite(res, n)                    res = 0 where res is inf / NaN (more non-finite values
//                                              than a selection holds)
//   unpack_checked(msg, k, lo, hi, idx, val)   a sparse message (support/sparse_message.hpp) checked
//                                              before anything is used
//   scatter_add(dst, idx, val, count)          dst[idx] += float(val)
//   scale_at / gather_at(dst, idx, count, ...)  dst[idx] *= s / read dst[idx] into a list (host only)
//   gather_keys(v, idx, count, keys)           keys[j] = the magnitude key of v[idx[j]] (OkTopK)
//   mark_bits / take_marked                    the union of P received index lists through a
//                                              two-level bitmap of the unit: O(P k + n / 4096),
//                                              in index order (host only)
//   merge_topk(a, b, k, out, records)          Definition 1 (gTop-k (Shi et al.)): add equal indices, keep
//                                              the k largest |sum| (ties: lower index)
//   restore_unselected / restore_records_in    Algorithm 4 line 10 and its exact completion
//
// Ordering. |v| is compared through the key bits(v) & 0x7fffffff, an unsigned integer that
// orders magnitudes exactly like the floats do (and -0 like +0); NaN keys sort above inf, so a
// NaN is always selected and reported rather than silently left in a residual. Equal keys are
// taken lowest index first, so a selection depends only on the values, never on the algorithm.
//
// Non-finite values. NaN never travels: sanitize() turns it into +inf before a value is
// encoded, so a received NaN always means a corrupt message (unpack_checked rejects it), while
// a genuine overflow still arrives as inf and is reported by Exchanger::finish(). Non-finite
// values are never put into a residual (a residual that held inf would poison every later
// iteration); the exchange that carried them is reported non-finite instead. They rank above
// every finite value, so a rank with more than k of them in a unit sends k (the result is then
// non-finite on every rank) and the engine clears the rest (clear_nonfinite). A finite value
// whose wire encoding overflows (fp16 above 65504 after the 1/P scaling) travels as inf: it is
// reported, and not kept in the residual either.

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../dtype.hpp"
#include "../support/sparse_message.hpp"
#include "cast.hpp"
#include "topk_merge.hpp"
#include "topk_sampled.hpp"
#include "topk_select.hpp"

namespace gflow::detail::kernels {

/// For each selected pool index: out[j] = W(sanitize(G[idx] * scale)); the residual keeps
/// G - float(out[j]) * unscale (0 when the wire value is not finite). G and residual are indexed
/// absolutely and may be the same array (the engine's residual holds G until selection). With an fp32 wire and scale 1 the residual of a
/// selected element is exactly 0; with a 16-bit wire it keeps the rounding error.
template <class I, class W>
void take_selected(const float* G, float* residual, const I* idx, std::size_t count, W* out, float scale, float unscale) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t i = static_cast<std::size_t>(idx[j]);
    const float v = G[i];
    const W w = wire_cast<W>(sanitize(v * scale));
    out[j] = w;
    const float d = to_float(w);
    residual[i] = !nonfinite_bit(d) ? v - d * unscale : 0.0f;
  }
}

/// True when every selected G[idx[j]] (count > 0) is inf / NaN: non-finite values rank above
/// every finite one, so only then can the residual still hold a non-finite value.
template <class I>
bool selection_all_nonfinite(const float* G, const I* idx, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j)
    if (!nonfinite_bit(G[static_cast<std::size_t>(idx[j])])) return false;
  return count != 0;
}

/// res[i] = 0 where res[i] is inf / NaN; returns how many were cleared.
inline std::size_t clear_nonfinite(float* res, std::size_t n) noexcept {
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (nonfinite_bit(res[i])) {
      res[i] = 0.0f;
      ++c;
    }
  return c;
}

// ---- validating a received message (the format: support/sparse_message.hpp) -------------------

/// Reads a message of capacity k and checks it before anything is used: status 0, count <= k,
/// every index in [lo, hi) and strictly increasing (so no duplicates), no NaN value. Copies the
/// entries to idx / val only when the whole message is valid; never writes past k entries.
template <class I, class W>
sparse_message::unpack_result unpack_checked(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val) noexcept {
  sparse_message::unpack_result r;
  r.header = sparse_message::read_header(msg);
  if (r.header.status != 0) {
    r.fault = sparse_message::fault_code::status;
    return r;
  }
  if (r.header.count > k) {
    r.fault = sparse_message::fault_code::count;
    r.position = r.header.count;
    return r;
  }
  const std::size_t count = static_cast<std::size_t>(r.header.count);
  const unsigned char* ip = msg + sparse_message::header_bytes;
  const unsigned char* vp = msg + sparse_message::header_bytes + k * sizeof(I);
  std::uint64_t prev = 0;
  for (std::size_t j = 0; j < count; ++j) {
    I x;
    std::memcpy(&x, ip + j * sizeof(I), sizeof(I));
    const std::uint64_t i = static_cast<std::uint64_t>(x);
    if (i < lo || i >= hi) {
      r.fault = sparse_message::fault_code::index;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    if (j > 0 && i <= prev) {
      r.fault = sparse_message::fault_code::order;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    prev = i;
    W w;
    std::memcpy(&w, vp + j * sizeof(W), sizeof(W));
    if (std::isnan(to_float(w))) {
      r.fault = sparse_message::fault_code::value;
      r.position = j;
      r.bad_index = i;
      return r;
    }
  }
  if (count) {
    std::memcpy(idx, ip, count * sizeof(I));
    std::memcpy(val, vp, count * sizeof(W));
  }
  r.count = count;
  return r;
}

/// dst[idx[j]] += float(val[j]) (indices distinct within one call).
template <class I, class W>
void scatter_add(float* dst, const I* idx, const W* val, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j) dst[static_cast<std::size_t>(idx[j])] += to_float(val[j]);
}

/// out[j] = float(val[j]) * scale (the decoded values of a list, e.g. to scatter or count them).
template <class W>
void decode_scaled(const W* val, std::size_t count, float scale, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) out[j] = to_float(val[j]) * scale;
}

/// dst[idx[j]] = v[j].
template <class I>
void scatter_set(float* dst, const I* idx, const float* v, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j) dst[static_cast<std::size_t>(idx[j])] = v[j];
}

/// dst[idx[j]] *= scale, and out[j] = the result (to count inf / NaN among them).
template <class I>
void scale_at(float* dst, const I* idx, std::size_t count, float scale, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    float& x = dst[static_cast<std::size_t>(idx[j])];
    x = x * scale;
    out[j] = x;
  }
}

/// out[j] = dst[idx[j]].
template <class I>
void gather_at(const float* dst, const I* idx, std::size_t count, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) out[j] = dst[static_cast<std::size_t>(idx[j])];
}

/// keys[j] = magnitude_key(v[idx[j]]) (OkTopK's keys of the entries it reduced; the device twin
/// is cuda::gather_keys, cuda/oktopk.cuh).
template <class I>
void gather_keys(const float* v, const I* idx, std::size_t count, std::uint32_t* keys) noexcept {
  for (std::size_t j = 0; j < count; ++j) keys[j] = magnitude_key(v[static_cast<std::size_t>(idx[j])]);
}

/// The union of index lists as a two-level bitmap of a unit: bit i of `bits` (bit i % 64 of word
/// i / 64) for element base + i, and bit w of `summary` for each word w of `bits` that has a bit
/// set, so reading the union out visits only those words (and n / 4096 summary words).
/// mark_bits sets the bits of idx[0..count); every idx[j] - base must lie within the unit.
template <class I>
void mark_bits(std::uint64_t* bits, std::uint64_t* summary, const I* idx, std::size_t count, std::uint64_t base) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[j]) - base;
    bits[i >> 6] |= std::uint64_t{1} << (i & 63);
    summary[i >> 12] |= std::uint64_t{1} << ((i >> 6) & 63);
  }
}

/// The marked elements in increasing order, written to out as base + bit index, and cleared
/// (both levels are all zero afterwards). summary_words = ceil(n / 4096). Returns how many.
inline std::size_t take_marked(std::uint64_t* bits, std::uint64_t* summary, std::size_t summary_words, std::uint64_t base,
                               std::uint64_t* out) noexcept {
  std::size_t n = 0;
  for (std::size_t s = 0; s < summary_words; ++s) {
    std::uint64_t y = summary[s];
    if (y == 0) continue;
    summary[s] = 0;
    do {
      const std::size_t w = (s << 6) + static_cast<std::size_t>(__builtin_ctzll(y));
      y &= y - 1;
      std::uint64_t x = bits[w];
      bits[w] = 0;
      const std::uint64_t at = base + (static_cast<std::uint64_t>(w) << 6);
      do {
        out[n++] = at + static_cast<std::uint64_t>(__builtin_ctzll(x));
        x &= x - 1;
      } while (x != 0);
    } while (y != 0);
  }
  return n;
}

}  // namespace gflow::detail::kernels
