#pragma once
// Host kernels of the Top-k sparsifiers (policies/topk.hpp): the references for the CUDA twins
// in include/gflow/cuda/topk.cuh, which produce the same selections and the same bits.
//
//   accumulate_residual(g, res, n)            G = g + res, written to both (res = G until selection)
//   radix_threshold(v, n, k, scratch)          the k-th largest |v| as a key, and how many of the
//                                              elements equal to it are taken (lowest indices first)
//   select_topk(v, n, k, base, out, scratch)   exact top-k by |v|, ties to the lower index,
//                                              indices (base + position) in increasing order
//   take_selected(G, res, idx, count, out, s)  wire values W(G * s); residual keeps G - W / s
//   clear_nonfinite(res, n)                    res = 0 where res is inf / NaN (more non-finite values
//                                              than a selection holds)
//   pack / unpack_checked                      the sparse message format below, validated on receipt
//   scatter_add(dst, idx, val, count)          dst[idx] += float(val)
//   merge_topk(a, b, k, out, records)          Definition 1 (paper 003): add equal indices, keep
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
//
// Message format (one message per rank and selection; sizes fixed by the capacity k so that
// every send/recv/all_gather/broadcast has the same byte count on every rank):
//   [header, 24 bytes][k indices of I (u32 or u64)][k values of W]
//   header = u64 count (<= k, entries in use), u32 status (0, or the fault a rank detected
//   upstream), u32 reporter rank, u32 source rank, u32 round; entries past `count` are unused.
// Indices are absolute pool positions, strictly increasing within a message.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "../dtype.hpp"
#include "cast.hpp"

namespace gflow::kernels {

/// |v| as an unsigned key with the same order (NaN above inf).
constexpr std::uint32_t magnitude_key(float v) noexcept { return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu; }

/// NaN -> +inf; every other value unchanged. Applied before a value is encoded for the wire.
constexpr float sanitize(float v) noexcept {
  return magnitude_key(v) > 0x7f800000u ? std::bit_cast<float>(0x7f800000u) : v;
}

/// G = g + residual, stored into both g (the pool) and residual.
inline void accumulate_residual(float* g, float* residual, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float G = g[i] + residual[i];
    g[i] = G;
    residual[i] = G;
  }
}

/// Where the k-th largest key lies: every element with key > `key` is selected, and the first
/// `take` elements (in index order) with key == `key`.
struct threshold {
  std::uint32_t key = 0;
  std::size_t take = 0;
};

namespace detail {
// Radix digits of the 31-bit key, most significant first: 11 + 10 + 10 bits.
inline constexpr int digit_shift[3] = {20, 10, 0};
inline constexpr std::uint32_t digit_bins[3] = {2048, 1024, 1024};
}  // namespace detail

/// Exact threshold of the k largest |v[i]| (1 <= k <= n). `scratch` holds n keys.
/// MSD radix select: a histogram of the top 11 bits over all n values, then 10-bit digits over
/// the candidates that share the chosen prefix (compacted into scratch), three passes in all.
inline threshold radix_threshold(const float* v, std::size_t n, std::size_t k, std::uint32_t* scratch) noexcept {
  std::size_t hist[2048];
  std::size_t remaining = k;  // how many of the candidates are still to be selected
  std::uint32_t prefix = 0;
  std::size_t cand = 0;
  for (int d = 0; d < 3; ++d) {
    const int sh = detail::digit_shift[d];
    const std::uint32_t bins = detail::digit_bins[d];
    std::fill(hist, hist + bins, std::size_t{0});
    if (d == 0) {
      for (std::size_t i = 0; i < n; ++i) ++hist[magnitude_key(v[i]) >> sh];
    } else {
      for (std::size_t i = 0; i < cand; ++i) ++hist[(scratch[i] >> sh) & (bins - 1)];
    }
    // Walk from the largest digit down until the remaining count is covered.
    std::uint32_t b = bins;
    std::size_t above = 0;
    while (b-- > 0) {
      if (above + hist[b] >= remaining) break;
      above += hist[b];
    }
    remaining -= above;
    prefix |= b << sh;
    if (d == 2) break;
    // Keep only the candidates in bin b (their higher digits already match the prefix).
    std::size_t kept = 0;
    const int next_sh = sh;
    if (d == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t key = magnitude_key(v[i]);
        if ((key >> next_sh) == b) scratch[kept++] = key;
      }
    } else {
      for (std::size_t i = 0; i < cand; ++i)
        if (((scratch[i] >> sh) & (bins - 1)) == b) scratch[kept++] = scratch[i];
    }
    cand = kept;
  }
  return {prefix, remaining};
}

/// Exact top-k of |v[0, n)|: writes base + position of the selected elements to out, in
/// increasing order, and returns the count (min(k, n)). Ties at the threshold go to the lower
/// index. `scratch` holds n keys (unused when k >= n).
template <class I>
std::size_t select_topk(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, std::uint32_t* scratch) noexcept {
  if (k == 0 || n == 0) return 0;
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<I>(base + i);
    return n;
  }
  const threshold t = radix_threshold(v, n, k, scratch);
  std::size_t take = t.take;
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = magnitude_key(v[i]);
    if (key > t.key || (key == t.key && take > 0)) {
      if (key == t.key) --take;
      out[c++] = static_cast<I>(base + i);
    }
  }
  return c;
}

/// For each selected pool index: out[j] = W(sanitize(G[idx] * scale)); the residual keeps
/// G - float(out[j]) * unscale (0 when the wire value is not finite). G and residual are the
/// pool and the residual (absolute indices). With an fp32 wire and scale 1 the residual of a
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

// ---- messages ----------------------------------------------------------------------------------

inline constexpr std::size_t message_header_bytes = 24;

/// Why a received message was rejected (carried in the header status once detected).
enum class message_fault : std::uint32_t { none = 0, count = 1, index = 2, order = 3, value = 4, status = 5 };

inline const char* parameter_of(message_fault f) noexcept {
  switch (f) {
    case message_fault::none: return "message";
    case message_fault::count: return "count";
    case message_fault::index: return "index";
    case message_fault::order: return "index";
    case message_fault::value: return "value";
    case message_fault::status: return "status";
  }
  return "message";
}

struct message_header {
  std::uint64_t count = 0;
  std::uint32_t status = 0;
  std::uint32_t reporter = 0;
  std::uint32_t source = 0;
  std::uint32_t round = 0;
};
static_assert(sizeof(message_header) == message_header_bytes);

/// Bytes of a message of capacity k.
constexpr std::size_t message_bytes(std::size_t k, std::size_t index_bytes, std::size_t value_bytes) noexcept {
  return message_header_bytes + k * (index_bytes + value_bytes);
}

/// Writes `count` (<= k) pairs and the header into msg (message_bytes(k, sizeof(I), sizeof(W)) bytes).
template <class I, class W>
void pack(unsigned char* msg, std::size_t k, const I* idx, const W* val, std::size_t count, message_header h = {}) noexcept {
  h.count = count;
  std::memcpy(msg, &h, sizeof h);
  if (count) {
    std::memcpy(msg + message_header_bytes, idx, count * sizeof(I));
    std::memcpy(msg + message_header_bytes + k * sizeof(I), val, count * sizeof(W));
  }
}

inline message_header read_header(const unsigned char* msg) noexcept {
  message_header h;
  std::memcpy(&h, msg, sizeof h);
  return h;
}

/// What unpack_checked found.
struct unpack_result {
  std::size_t count = 0;               // entries unpacked (0 when rejected)
  message_fault fault = message_fault::none;
  std::uint64_t position = 0;          // entry at fault (count: the count received)
  std::uint64_t bad_index = 0;         // the offending index (index / order faults)
  message_header header{};             // as received
  [[nodiscard]] bool ok() const noexcept { return fault == message_fault::none; }
};

/// Reads a message of capacity k and checks it before anything is used: status 0, count <= k,
/// every index in [lo, hi) and strictly increasing (so no duplicates), no NaN value. Copies the
/// entries to idx / val only when the whole message is valid; never writes past k entries.
template <class I, class W>
unpack_result unpack_checked(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val) noexcept {
  unpack_result r;
  r.header = read_header(msg);
  if (r.header.status != 0) {
    r.fault = message_fault::status;
    return r;
  }
  if (r.header.count > k) {
    r.fault = message_fault::count;
    r.position = r.header.count;
    return r;
  }
  const std::size_t count = static_cast<std::size_t>(r.header.count);
  const unsigned char* ip = msg + message_header_bytes;
  const unsigned char* vp = msg + message_header_bytes + k * sizeof(I);
  std::uint64_t prev = 0;
  for (std::size_t j = 0; j < count; ++j) {
    I x;
    std::memcpy(&x, ip + j * sizeof(I), sizeof(I));
    const std::uint64_t i = static_cast<std::uint64_t>(x);
    if (i < lo || i >= hi) {
      r.fault = message_fault::index;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    if (j > 0 && i <= prev) {
      r.fault = message_fault::order;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    prev = i;
    W w;
    std::memcpy(&w, vp + j * sizeof(W), sizeof(W));
    if (std::isnan(to_float(w))) {
      r.fault = message_fault::value;
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

/// One sentence on a rejected message, for the error text.
inline std::string describe(const unpack_result& r, std::size_t k, std::uint64_t lo, std::uint64_t hi) {
  switch (r.fault) {
    case message_fault::none: return "the message is valid.";
    case message_fault::count:
      return "it claims " + std::to_string(r.position) + " entries, more than the capacity k = " + std::to_string(k) + ".";
    case message_fault::index:
      return "entry " + std::to_string(r.position) + " has index " + std::to_string(r.bad_index) + ", outside the selection range [" +
             std::to_string(lo) + ", " + std::to_string(hi) + ").";
    case message_fault::order:
      return "entry " + std::to_string(r.position) + " has index " + std::to_string(r.bad_index) +
             ", not greater than the entry before it (a duplicate or out-of-order index).";
    case message_fault::value: return "entry " + std::to_string(r.position) + " (index " + std::to_string(r.bad_index) + ") has a NaN value.";
    case message_fault::status: return "its header carries fault status " + std::to_string(r.header.status) + ".";
  }
  return "it is malformed.";
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

/// Scratch of merge_topk for lists of capacity k: 2k union entries.
template <class I>
struct merge_scratch {
  I* idx;              // 2k
  float* sum;          // 2k
  std::uint32_t* key;  // 2k
};

/// Definition 1 (paper 003) on two index-sorted lists a and b of at most k entries each:
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

}  // namespace gflow::kernels
