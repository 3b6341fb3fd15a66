#pragma once
// transport_archetype<Space>: every member the gflow::transport concept lists, with trivial
// bodies and no behaviour. It exists so that the engine concepts (engines/concepts.hpp) can be
// asserted right where each engine, topology engine and backend is defined, without a real
// transport; nothing ever runs on it.
#include <cstddef>

#include "../dtype.hpp"
#include "transport.hpp"

namespace gflow {

template <class Space = host_memory>
struct transport_archetype : transport_base<Space> {
  struct request {};

  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  template <class E> void all_reduce(E*, std::size_t, reduce_op) {}
  template <class E> void all_gather(const E*, E*, std::size_t) {}
  template <class E> void broadcast(E*, std::size_t, int) {}
  template <class E> void reduce(E*, std::size_t, reduce_op, int) {}
  template <class E> void send(const E*, std::size_t, int) {}
  template <class E> void recv(E*, std::size_t, int) {}
  void barrier() {}
  template <class E> void all_to_all(const E*, E*, std::size_t) {}
  template <class E> void all_to_allv(const E*, const std::size_t*, E*, const std::size_t*) {}
  template <class E> void all_gatherv(const E*, std::size_t, E*, const std::size_t*) {}
  template <class E> request iall_reduce(E*, std::size_t, reduce_op) { return {}; }
  template <class E> request iall_gather(const E*, E*, std::size_t) { return {}; }
  template <class E> request ibroadcast(E*, std::size_t, int) { return {}; }
  template <class E> request ireduce(E*, std::size_t, reduce_op, int) { return {}; }
  template <class E> request isend(const E*, std::size_t, int) { return {}; }
  template <class E> request irecv(E*, std::size_t, int) { return {}; }
  void wait(request&) {}
  transport_archetype split(int, int) const { return {}; }
};

static_assert(transport<transport_archetype<>> && transport<transport_archetype<device_memory>>);
static_assert(variable_transport<transport_archetype<>> && variable_transport<transport_archetype<device_memory>>);

}  // namespace gflow
