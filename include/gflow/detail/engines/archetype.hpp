#pragma once
// archetype_context<W>: a real exchange context over the archetype transport and the host backend,
// for asserting the engine concepts (engines/concepts.hpp) right where each engine is defined.
// Nothing runs on it.
#include "../../transport/archetype.hpp"
#include "concepts.hpp"
#include "context.hpp"
#include "host_backend.hpp"
#include "topology.hpp"

namespace gflow::detail {

template <class W = float>
using archetype_context = exchange_context<transport_archetype<>, host_backend, W, ring_engine<transport_archetype<>>>;

}  // namespace gflow::detail
