#pragma once
// Momentum SGD with CSC's update rule (GradientFlow (Sun et al.), Algorithm 1, "SGD Update Step"):
//
//   chunk exchanged this iteration:   u = hu = momentum * hu + lr * g;   w = w - u
//   chunk kept back:                  nothing (hu stays hu, w stays w)
//
// where g is the averaged gradient the exchanger left in the pool and the chunk list is the
// exchanger's selection (ex.sparsifier().selected_chunks(), ascending). The paper writes
// w = w + u with a signed learning rate; gflow descends (w - u) with lr > 0.
//
//   gflow::optim::momentum_sgd opt(ex.pool_size(), /*lr=*/0.1f, /*momentum=*/0.9f);
//   auto st = ex.finish();
//   if (st.finite()) opt.step(weights, {ex.pool_data(), ex.pool_size()}, ex.sparsifier().selected_chunks(),
//                             ex.sparsifier().chunk_elems());
//
// Weights and the velocity hu are indexed like the pool (generation order, plan::pool_plan
// offsets): keep the parameters in one pool-shaped buffer, or call step() per tensor with the
// tensor's pool offset. With the Dense sparsifier use step_all() (every element is updated).
// The CUDA twin is include/gflow/detail/cuda/momentum_sgd.cuh (bit-identical updates).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"

namespace gflow::optim {

namespace kernels {
/// One element of Algorithm 1's update step, written so that host and device round alike
/// (no fused multiply-add: the device twin uses __fmul_rn / __fadd_rn).
inline void momentum_update(float& w, float g, float& hu, float lr, float momentum) noexcept {
  const float a = momentum * hu;
  const float b = lr * g;
  const float u = a + b;
  hu = u;
  w = w - u;
}

/// Updates the elements of pool range [offset, offset + n) that lie in the listed chunks
/// (chunk c covers [c * chunk_elems, (c + 1) * chunk_elems)); w, g, hu point at element `offset`.
/// `selected` is ascending. The others are left alone.
inline void momentum_sgd_step(float* w, const float* g, float* hu, std::size_t offset, std::size_t n, std::size_t chunk_elems,
                              const std::uint32_t* selected, std::size_t count, float lr, float momentum) noexcept {
  if (n == 0 || count == 0) return;
  const std::size_t first_chunk = offset / chunk_elems;
  const std::size_t end = offset + n;
  // First listed chunk that can reach the range (ascending list: binary search).
  std::size_t lo = 0, hi = count;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (selected[mid] < first_chunk) lo = mid + 1;
    else hi = mid;
  }
  for (std::size_t j = lo; j < count; ++j) {
    const std::size_t c = selected[j];
    const std::size_t b = c * chunk_elems;
    if (b >= end) break;
    const std::size_t e = b + chunk_elems < end ? b + chunk_elems : end;
    for (std::size_t i = b < offset ? offset : b; i < e; ++i) momentum_update(w[i - offset], g[i - offset], hu[i - offset], lr, momentum);
  }
}

/// Every element (dense exchange).
inline void momentum_sgd_step_all(float* w, const float* g, float* hu, std::size_t n, float lr, float momentum) noexcept {
  for (std::size_t i = 0; i < n; ++i) momentum_update(w[i], g[i], hu[i], lr, momentum);
}
}  // namespace kernels

/// Momentum SGD over a pool-shaped parameter buffer, with Algorithm 1's selection-aware step.
/// Owns the velocity hu (one float per pool element, zero at start).
class momentum_sgd {
 public:
  momentum_sgd(std::size_t pool_elems, float lr, float momentum) : hu_(pool_elems, 0.0f) {
    set_learning_rate(lr);
    set_momentum(momentum);
  }

  /// Algorithm 1's step over the whole pool: w and g are pool-shaped (pool_elems floats).
  void step(std::span<float> w, std::span<const float> g, std::span<const std::uint32_t> selected, std::size_t chunk_elems) {
    step(w, g, 0, selected, chunk_elems);
  }

  /// The same for one tensor (or any pool range): w and g are its elements, `pool_offset` is
  /// where it starts in the pool (ex.pool_plan().offset[i]).
  void step(std::span<float> w, std::span<const float> g, std::size_t pool_offset, std::span<const std::uint32_t> selected,
            std::size_t chunk_elems) {
    check_range(w.size(), g.size(), pool_offset);
    if (chunk_elems == 0)
      throw invalid_argument("chunk_elems", "the chunk size must be positive (got 0).", "pass the exchanger's ex.sparsifier().chunk_elems().");
    const std::size_t chunks = (hu_.size() + chunk_elems - 1) / chunk_elems;
    for (std::size_t j = 0; j < selected.size(); ++j) {
      if (selected[j] >= chunks)
        throw invalid_argument("selected", fmt::format("chunk {} is outside the pool's {}"
                                               " chunks of {} elements.", selected[j], chunks, chunk_elems),
                               "pass ex.sparsifier().selected_chunks() with the same exchanger's chunk size.");
      if (j != 0 && selected[j] <= selected[j - 1])
        throw invalid_argument("selected", fmt::format("the chunk list is not strictly ascending at position {}.", j),
                               "pass ex.sparsifier().selected_chunks() (ascending, no duplicates).");
    }
    kernels::momentum_sgd_step(w.data(), g.data(), hu_.data() + pool_offset, pool_offset, w.size(), chunk_elems, selected.data(),
                               selected.size(), lr_, momentum_);
  }

  /// Plain momentum SGD on every element (Dense sparsifier, or CSC during dense warm-up).
  void step_all(std::span<float> w, std::span<const float> g, std::size_t pool_offset = 0) {
    check_range(w.size(), g.size(), pool_offset);
    kernels::momentum_sgd_step_all(w.data(), g.data(), hu_.data() + pool_offset, w.size(), lr_, momentum_);
  }

  void set_learning_rate(float lr) {
    if (!(std::isfinite(lr) && lr >= 0.0f))
      throw invalid_argument("learning_rate", fmt::format("the learning rate must be finite and non-negative (got {:f}).", lr),
                             "pass e.g. 0.1 (gflow descends: w -= u).");
    lr_ = lr;
  }
  void set_momentum(float m) {
    if (!(m >= 0.0f && m < 1.0f))
      throw invalid_argument("momentum", fmt::format("the SGD momentum must lie in [0, 1) (got {:f}).", m), "pass e.g. 0.9.");
    momentum_ = m;
  }
  [[nodiscard]] float learning_rate() const noexcept { return lr_; }
  [[nodiscard]] float momentum() const noexcept { return momentum_; }
  /// Algorithm 1's historical update hu, pool-shaped (checkpoint it with the model).
  [[nodiscard]] std::span<float> velocity() noexcept { return hu_; }
  [[nodiscard]] std::span<const float> velocity() const noexcept { return hu_; }

 private:
  void check_range(std::size_t nw, std::size_t ng, std::size_t offset) const {
    if (nw != ng)
      throw invalid_argument("gradients", fmt::format("the weights have {} elements, the gradients {}.", nw, ng),
                             "pass the weights and gradients of the same tensor (or of the whole pool).");
    if (offset > hu_.size() || nw > hu_.size() - offset)
      throw invalid_argument("pool_offset", fmt::format("range [{}, {}"
                                                ") is outside the pool of {} elements.", offset, offset + nw, hu_.size()),
                             "pass the tensor's offset from ex.pool_plan().offset and its own elements.");
  }

  std::vector<float> hu_;
  float lr_ = 0.0f;
  float momentum_ = 0.0f;
};

}  // namespace gflow::optim
