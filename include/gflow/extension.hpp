#pragma once
// The extension contract: what a policy written outside gflow is checked against and works with
// (docs/GUIDE.md, "Writing your own policy"; examples/01_custom_sparsifier.cpp and
// examples/02_custom_topology.cpp). Everything here is public; the exchanger requires the same
// concepts under their gflow::detail names.
//
//   sparsifier_engine<E, Ctx>   Sparsifier<S>: S::engine<Ctx> exchanges a bucket of the pool
//   topology_engine<E, T, W>    Topology<A>: A::engine<T> carries one dense allreduce over T
//   checkpointed<E>             save_state / read_state / restore_state (both engines)
//   counts_collectives<E>       optional: its own count for exchange_status::collectives
//   phased_engine<E>            optional: start(b) / complete(b, request&) (Overlap<Chained>)
//   independent_buckets_engine<E> optional: no state crosses buckets (Overlap<Concurrent<N>>)
//
//   exchange_context<...>       the Ctx an engine is built over: members and helpers in the GUIDE
//   archetype_context<W>        a real Ctx over a transport that does nothing, for an early
//                               static_assert(gflow::sparsifier_engine<my_engine<gflow::archetype_context<>>, ...>)
//   checkpoint_writer / checkpoint_reader   what save_state writes to and read_state reads from
//   transport_archetype<Space>  a transport that does nothing (transport/archetype.hpp), for
//                               static_assert(gflow::topology_engine<my_engine<gflow::transport_archetype<>>, ...>)
//   pool_plan, bucket           the pool's layout and the fusion plan (cx.pool, cx.buckets; <gflow/pool.hpp>)
#include "detail/engines/archetype.hpp"
#include "detail/engines/concepts.hpp"
#include "detail/engines/context.hpp"
#include "detail/support/checkpoint.hpp"
#include "pool.hpp"

namespace gflow {

template <class E, class Ctx>
concept sparsifier_engine = detail::sparsifier_engine<E, Ctx>;
template <class E, class T, class W = float>
concept topology_engine = detail::topology_engine<E, T, W>;
template <class E>
concept checkpointed = detail::checkpointed<E>;
template <class E>
concept counts_collectives = detail::counts_collectives<E>;
template <class E>
concept phased_engine = detail::phased_engine<E>;
template <class E>
concept independent_buckets_engine = detail::independent_buckets_engine<E>;

/// The exchange context a sparsifier engine is built over (its Ctx).
template <class T, class Backend, class W, class Topo>
using exchange_context = detail::exchange_context<T, Backend, W, Topo>;
/// An exchange context over a transport that does nothing and host memory, with wire type W:
/// for asserting sparsifier_engine where one's engine is defined. Nothing runs on it.
template <class W = float>
using archetype_context = detail::archetype_context<W>;

/// What save_state writes to and read_state reads from (methods: docs/GUIDE.md).
using checkpoint_writer = detail::checkpoint_writer;
using checkpoint_reader = detail::checkpoint_reader;

}  // namespace gflow
