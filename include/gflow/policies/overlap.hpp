#pragma once
// Overlap<S>: who issues collectives and when. None (the default): collectives are started on
// the caller's thread from ready() as soon as a bucket is complete, using the transport's
// non-blocking form, and completed in finish(); there is no progress thread or extra stream.
// Funneled / Concurrent<N> / Chained (paper 002) are tracked in the issue tracker.
#include <concepts>

#include "family.hpp"

namespace gflow {

struct None {};

template <class S = None>
struct Overlap {
  using gflow_family = overlap_family;
  using strategy = S;
};

template <class P>
concept overlap_policy = std::same_as<typename P::gflow_family, overlap_family> && requires { typename P::strategy; };

static_assert(overlap_policy<Overlap<>>);

}  // namespace gflow
