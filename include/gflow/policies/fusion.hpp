#pragma once
// Fusion<threshold, first_bucket>: lazy allreduce (GradientFlow (Sun et al.) section 3.1; tensor fusion in
// Jia et al.). Buckets are contiguous pool ranges of whole tensors, closed once they hold at
// least `threshold` bytes on the wire; a bucket is launched, without copying, as soon as the
// contiguous ready prefix of the pool covers it. An optional smaller first bucket starts
// communication early (PyTorch DDP: 1 MiB, then 25 MiB). Exchanger::set_fusion re-plans both
// between iterations (a tuner of one's own); Fusion<Auto> leaves them to gflow's tuner.
// Leaving Fusion out exchanges one collective per tensor (the default, detail::no_fusion).
#include <concepts>
#include <cstddef>

#include "family.hpp"

namespace gflow {

/// Fusion<Auto>: the threshold and first bucket are chosen, and re-chosen when measurements
/// drift, by the auto-tuner (gflow/detail/exchanger/tuner.hpp), from the fitted alpha-beta cost of the buckets and
/// the times at which tensors become ready. It starts from 4 MiB.
inline constexpr std::size_t Auto = ~std::size_t{0};

template <std::size_t ThresholdBytes, std::size_t FirstBucketBytes = 0>
struct Fusion {
  static_assert(ThresholdBytes > 0,
                "gflow::Fusion<0>: the fusion threshold must be positive. "
                "To exchange one collective per tensor, leave Fusion out of the Exchanger.");
  static_assert(ThresholdBytes != Auto || FirstBucketBytes == 0,
                "gflow::Fusion<Auto, first>: the auto-tuner chooses the first bucket too. Write Fusion<Auto>.");
  using gflow_family = fusion_family;
  static constexpr bool autotuned = ThresholdBytes == Auto;
  static constexpr std::size_t threshold_bytes = autotuned ? (std::size_t{4} << 20) : ThresholdBytes;
  static constexpr std::size_t first_bucket_bytes = FirstBucketBytes;
};

namespace detail {
/// The default when Fusion is left out: no fusion, one collective per tensor.
struct no_fusion {
  using gflow_family = fusion_family;
  static constexpr std::size_t threshold_bytes = 0;
  static constexpr std::size_t first_bucket_bytes = 0;
};
}  // namespace detail

template <class P>
concept fusion_policy = std::same_as<typename P::gflow_family, fusion_family> && requires {
  { P::threshold_bytes } -> std::convertible_to<std::size_t>;
  { P::first_bucket_bytes } -> std::convertible_to<std::size_t>;
};

static_assert(fusion_policy<detail::no_fusion>);
static_assert(fusion_policy<Fusion<4 << 20>>);
static_assert(fusion_policy<Fusion<25 << 20, 1 << 20>>);
static_assert(fusion_policy<Fusion<Auto>>);

}  // namespace gflow
