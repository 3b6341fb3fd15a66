#pragma once
// Overlap<S>: who issues the collectives and when (GradientFlow (Sun et al.) section 2.6; Mamidala's designs).
// Whatever the strategy, every rank issues the same collectives in the same order on each
// communicator, decided by the bucket plan, whatever order ready() is called in.
//
//   None          no communication runs concurrently with the caller: a bucket is exchanged with
//                 the transport's blocking collective inside the ready() call that completes it.
//                 (Measured: on MPI, starting every bucket with MPI_Iallreduce and waiting at
//                 finish() was 1.9x slower than blocking MPI_Allreduce per bucket on resnet50 -
//                 nothing progresses them in between. See docs/BENCHMARKS.md.)
//   Funneled      Mamidala's funneled design: one issuing thread per exchanger performs every
//                 collective, in pool order; ready() only posts the bucket and returns.
//   Concurrent<N> Mamidala's concurrent communicators: N issuing threads, each with its own
//                 communicator split from the transport once, at construction; bucket b always goes
//                 to communicator b mod N, so at most N collectives are outstanding and each
//                 communicator sees the same order on every rank.
//   Chained       Mamidala's dependency chaining: one issuing thread starts each bucket's
//                 non-blocking collective as soon as it is ready, and completes them in order, so
//                 later buckets start before earlier ones end. Needs a sparsifier whose exchange
//                 splits into phases (Dense).
//
// With a host-memory transport the issuing threads call the transport while the trainer's own
// thread computes: for MPI, initialise with MPI_THREAD_MULTIPLE (gflow::mpi::environment does)
// unless the trainer makes no MPI call of its own between ready() and finish() (then SERIALIZED
// suffices). An error on an issuing thread is rethrown by finish(), never lost, never a hang of
// this rank (peers blocked in a collective are the transport's timeout's business).
// On a stream-ordered (CUDA) backend all strategies enqueue on the transport's stream from the
// caller's thread: the stream is already the concurrent issuer.
#include <concepts>

#include <type_traits>

#include "family.hpp"

namespace gflow {

struct Funneled {};
template <int N>
struct Concurrent {
  static_assert(N >= 1, "gflow::Concurrent<N>: N is the number of communicators and must be at least 1.");
  static constexpr int communicators = N;
};
struct Chained {};

/// The four strategies (the runners in exchanger/runners.hpp implement exactly these).
template <class S>
struct is_overlap_strategy : std::false_type {};
template <>
struct is_overlap_strategy<None> : std::true_type {};
template <>
struct is_overlap_strategy<Funneled> : std::true_type {};
template <int N>
struct is_overlap_strategy<Concurrent<N>> : std::true_type {};
template <>
struct is_overlap_strategy<Chained> : std::true_type {};
template <class S>
concept overlap_strategy = is_overlap_strategy<S>::value;

// Shaped like Sparsifier<S> on purpose (see the note in policies/sparsifier.hpp).
template <class S = None>
struct Overlap {
  static_assert(overlap_strategy<S>,
                "gflow::Overlap<S>: S is not an overlap strategy. "
                "Use gflow::None, gflow::Funneled, gflow::Concurrent<N> or gflow::Chained.");
  // Instantiates S, so that a strategy's own check (Concurrent<0>) fires here and not never: a
  // name alone does not instantiate a class template, and a runner over zero lanes would divide by 0.
  static_assert(!overlap_strategy<S> || sizeof(S) > 0);
  using gflow_family = overlap_family;
  // None for a wrong S keeps Overlap<not-a-strategy> down to the one static_assert above.
  using strategy = std::conditional_t<overlap_strategy<S>, S, None>;
};

template <class P>
concept overlap_policy = std::same_as<typename P::gflow_family, overlap_family> && requires { typename P::strategy; };

static_assert(overlap_policy<Overlap<>>);
static_assert(overlap_policy<Overlap<Funneled>>);
static_assert(overlap_policy<Overlap<Concurrent<2>>>);
static_assert(overlap_policy<Overlap<Chained>>);

}  // namespace gflow
