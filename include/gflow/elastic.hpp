#pragma once
// Synchronous elastic averaging SGD (Sync EASGD; You et al., equations 1-2): an exchange of
// weights rather than gradients. Every rank keeps its own weights W^i and a copy of the center
// weight C; each iteration
//
//   S = sum over ranks of W^i_t                 one allreduce of all layers packed in one message
//   W^i_{t+1} = W^i_t - lr * (g^i_t + rho * (W^i_t - C_t))            (1)
//   C_{t+1}   = C_t + lr * rho * (S - P * C_t)    = C_t + lr * sum_i rho * (W^i_t - C_t)   (2)
//
// S is identical on every rank, so every rank's copy of C stays identical (the paper's master
// is replicated; no broadcast is needed). With momentum mu > 0 the local update is You et al.'s
// equations 5-6 (MEASGD): V = mu * V - lr * g;  W = W + V - lr * rho * (W - C).
//
//   gflow::elastic_averager<gflow::mpi::transport> ea(comm, weights, /*rho=*/0.9f / (lr * P));
//   each iteration: compute g from weights; ea.step(weights, g, lr);   evaluate ea.center()
//
// Stability: (2) is C_{t+1} = (1 - lr*rho*P) C_t + lr*rho*S, a convex combination only when
// lr * rho * P <= 1; step() rejects larger values (Zhang et al. suggest lr * rho * P = 0.9).
// Host memory, fp32 on the wire; weights must be one contiguous buffer (the "single-layer
// layout" of You et al. section 5.1), e.g. a pool-shaped parameter buffer.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"
#include "transport/transport.hpp"

namespace gflow {

template <class T>
class elastic_averager {
  static_assert(transport<T>, "gflow::elastic_averager<T>: T is not a gflow transport (include/gflow/transport/transport.hpp).");
  static_assert(std::is_same_v<typename T::memory_space, host_memory>,
                "gflow::elastic_averager<T>: works on host memory; use gflow::mpi::transport or gflow::inproc::transport.");

 public:
  /// The center starts as the average of the ranks' initial weights (one allreduce; a
  /// collective: every rank constructs its averager with the same number of weights).
  elastic_averager(T& t, std::span<const float> weights, float rho, float momentum = 0.0f)
      : t_(&t), center_(weights.begin(), weights.end()), sum_(weights.size()), velocity_(momentum > 0.0f ? weights.size() : 0) {
    if (weights.empty())
      throw invalid_argument("weights", "elastic averaging needs at least one weight.", "pass the model's packed parameter buffer.");
    set_rho(rho);
    if (!(momentum >= 0.0f && momentum < 1.0f))
      throw invalid_argument("momentum", fmt::format("the EASGD momentum must lie in [0, 1) (got {:f}).", momentum),
                             "pass 0 for You et al.'s equations 1-2 or e.g. 0.9 for MEASGD (equations 5-6).");
    momentum_ = momentum;
    t_->all_reduce(center_.data(), center_.size(), reduce_op::sum);
    const float inv = 1.0f / static_cast<float>(t_->size());
    for (float& c : center_) c *= inv;
  }

  /// One Sync EASGD iteration: w holds this rank's weights, g its gradient (both packed, the
  /// size given at construction). Updates w by (1) (or 5-6) and the center by (2).
  void step(std::span<float> w, std::span<const float> g, float lr) {
    if (w.size() != center_.size() || g.size() != center_.size())
      throw invalid_argument("weights", fmt::format("step() got {} weights and {}"
                                            " gradients; the averager holds {}.", w.size(), g.size(), center_.size()),
                             "pass the same packed buffers every iteration.");
    const float P = static_cast<float>(t_->size());
    if (!(std::isfinite(lr) && lr >= 0.0f) || lr * rho_ * P > 1.0f)
      throw invalid_argument("learning_rate", fmt::format("lr * rho * P = {:f} (lr {:f}, rho "
                                                  "{:f}, P {}"
                                                  "): the center update (2) diverges above 1 (or lr is negative / not finite).", lr * rho_ * P, lr, rho_, t_->size()),
                             "lower rho or the learning rate so that lr * rho * P <= 1 (e.g. rho = 0.9 / (lr * P)).");
    std::copy(w.begin(), w.end(), sum_.begin());
    t_->all_reduce(sum_.data(), sum_.size(), reduce_op::sum);  // all layers, one message
    const float a = lr * rho_;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float diff = w[i] - center_[i];  // W^i_t - C_t, before either update
      if (momentum_ > 0.0f) {
        velocity_[i] = momentum_ * velocity_[i] - lr * g[i];
        w[i] = w[i] + velocity_[i] - a * diff;
      } else {
        w[i] = w[i] - lr * (g[i] + rho_ * diff);
      }
      center_[i] = center_[i] + a * (sum_[i] - P * center_[i]);
    }
    wire_bytes_ = sum_.size() * sizeof(float);
  }

  void set_rho(float rho) {
    if (!(std::isfinite(rho) && rho > 0.0f))
      throw invalid_argument("rho", fmt::format("the elastic coupling rho must be finite and positive (got {:f}).", rho),
                             "pass e.g. 0.9 / (lr * P), so that lr * rho * P = 0.9.");
    rho_ = rho;
  }
  [[nodiscard]] float rho() const noexcept { return rho_; }
  [[nodiscard]] float momentum() const noexcept { return momentum_; }
  /// The center weight C (identical on every rank): the model to evaluate.
  [[nodiscard]] std::span<const float> center() const noexcept { return center_; }
  /// Bytes this rank handed to the allreduce in the last step (0 before the first).
  [[nodiscard]] std::size_t wire_bytes() const noexcept { return wire_bytes_; }

 private:
  T* t_;
  std::vector<float> center_;
  std::vector<float> sum_;
  std::vector<float> velocity_;
  float rho_ = 0.0f;
  float momentum_ = 0.0f;
  std::size_t wire_bytes_ = 0;
};

}  // namespace gflow
