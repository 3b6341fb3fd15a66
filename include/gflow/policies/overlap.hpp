#pragma once
// Overlap<S>: who issues collectives and when. None (the default): no communication runs
// concurrently with the caller. A bucket is exchanged with the transport's blocking collective
// inside the ready() call that completes it, on the caller's thread; finish() only checks that
// the iteration is complete and reports its status. (Measured: on MPI without a progress
// thread, starting every bucket with MPI_Iallreduce and waiting at finish() was 1.9x slower
// than blocking MPI_Allreduce per bucket on resnet50 - nothing progresses them in between.)
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
