#pragma once
// Host kernels of coarse-grained sparse communication (CSC, paper 000 section 3.2 and
// Algorithm 1). These are the references: the CUDA twins in include/gflow/cuda/sparse_chunks.cuh
// have the same semantics (tests/cuda/test_csc.cu compares them).
//
// The pool of n elements is cut into chunks of C elements: chunk c covers
// [c * C, min((c + 1) * C, n)), so only the last chunk can be partial. Chunk lists are arrays of
// 32-bit chunk indices in ascending order (so that compacted chunk j starts at j * C in the buffer).
//
//   chunk_l1_norms(pool, n, C, list, count, norms, scale)   norms[c] = scale * sum |pool[i]|, i in chunk c
//   compact_chunks(pool, hist, n, C, list, count, out)      out = pool + hist over the listed chunks, back to
//                                                            back; hist = 0 there (Algorithm 1, selected)
//   scatter_chunks(buf, pool, n, C, list, count, norms, s)  pool = buf over the listed chunks; optionally
//                                                            norms[c] = s * L1 of what was scattered
//   defer_chunks(pool, hist, n, C, list, count, m, norms)   g = pool + hist; norms[c] = L1(g); hist = m * g
//                                                            (0 where g is inf/NaN); pool = 0 (Algorithm 1,
//                                                            unselected)
//   chunk_key(norm)                                          the order selection uses (NaN highest)
//   select_top_chunks(norms, chunks, k, out)                 out[0, k): the k chunks with the largest norms,
//                                                            ties to the lower index, ascending;
//                                                            out[k, chunks): the others, ascending
//
// L1 norms are accumulated in double per chunk and rounded to float once.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>

namespace gflow::kernels {

namespace detail {
inline constexpr std::size_t chunk_begin(std::size_t c, std::size_t C) noexcept { return c * C; }
inline constexpr std::size_t chunk_end(std::size_t c, std::size_t n, std::size_t C) noexcept {
  const std::size_t e = (c + 1) * C;
  return e < n ? e : n;
}
}  // namespace detail

/// norms[list[j]] = scale * (L1 norm of chunk list[j] of the pool), for j < count.
inline void chunk_l1_norms(const float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float* norms,
                           float scale = 1.0f) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    double s = 0;
    for (std::size_t i = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C); i < e; ++i) s += std::fabs(pool[i]);
    norms[c] = scale * static_cast<float>(s);
  }
}

/// Copies the listed chunks of pool + hist back to back into out (when hist is null, of pool
/// alone) and clears hist there. Returns the elements written.
inline std::size_t compact_chunks(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* out) noexcept {
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    if (hist != nullptr) {
      for (std::size_t i = b; i < e; ++i) {
        out[k++] = pool[i] + hist[i];
        hist[i] = 0.0f;
      }
    } else {
      std::copy(pool + b, pool + e, out + k);
      k += e - b;
    }
  }
  return k;
}

/// The inverse of compact_chunks: the listed chunks of pool = buf, read back to back. When norms
/// is not null, norms[c] = scale * (L1 norm of the values written into chunk c). Returns the
/// elements read.
inline std::size_t scatter_chunks(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* norms = nullptr, float scale = 1.0f) noexcept {
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    if (norms != nullptr) {
      double s = 0;
      for (std::size_t i = b; i < e; ++i) {
        const float v = buf[k++];
        pool[i] = v;
        s += std::fabs(v);
      }
      norms[c] = scale * static_cast<float>(s);
    } else {
      std::copy(buf + k, buf + k + (e - b), pool + b);
      k += e - b;
    }
  }
  return k;
}

/// Algorithm 1 for the chunks that are not exchanged this iteration: the accumulated gradient
/// g = pool + hist stays local, its L1 norm goes to norms[c] (when norms is not null), the
/// history keeps momentum * g, and the pool is cleared (the optimizer sees no gradient there).
/// A non-finite g is not kept (its history element becomes 0: an inf/NaN in the history would
/// poison every later exchange of the chunk); it still makes the chunk's norm inf/NaN, which is
/// how the engine reports it on every rank once the norms are allreduced.
inline void defer_chunks(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float momentum,
                         float* norms) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    double s = 0;
    for (std::size_t i = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C); i < e; ++i) {
      const float g = pool[i] + hist[i];
      s += std::fabs(g);
      hist[i] = (std::bit_cast<std::uint32_t>(g) & 0x7f800000u) != 0x7f800000u ? momentum * g : 0.0f;
      pool[i] = 0.0f;
    }
    if (norms != nullptr) norms[list[j]] = static_cast<float>(s);
  }
}

/// The order chunk selection uses, as an unsigned key: larger key = more important. Finite
/// values and infinities keep their order; every NaN ranks above +inf, so a chunk whose norm is
/// NaN is exchanged (and reported) rather than kept back forever.
constexpr std::uint32_t chunk_key(float norm) noexcept {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(norm);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);        // the usual float -> ordered uint map
}

/// Top-k chunk selection with a deterministic tie-break: out[0, k) holds the k chunks with the
/// largest chunk_key(norms[c]), equal keys going to the lower chunk index, in ascending index
/// order; out[k, chunks) holds every other chunk, ascending. k is clamped to [0, chunks].
/// Allocates nothing (out is the scratch). Every rank that passes the same norms gets the same
/// lists.
inline void select_top_chunks(const float* norms, std::size_t chunks, std::size_t k, std::uint32_t* out) {
  if (k > chunks) k = chunks;
  std::iota(out, out + chunks, std::uint32_t{0});
  if (k != 0 && k != chunks) {
    // A strict total order (key descending, then index ascending): nth_element is deterministic.
    auto more_important = [norms](std::uint32_t a, std::uint32_t b) {
      const std::uint32_t ka = chunk_key(norms[a]), kb = chunk_key(norms[b]);
      return ka != kb ? ka > kb : a < b;
    };
    std::nth_element(out, out + k, out + chunks, more_important);
    std::sort(out, out + k);
    std::sort(out + k, out + chunks);
  }
}

}  // namespace gflow::kernels
