#pragma once
// Transports that satisfy gflow::transport but that the Exchanger must reject, for the
// compile-fail cases. ok_control.cpp checks that they really are transports, so a case that
// uses them fails on the Exchanger's own static_assert and not on a broken fake.
#include <cstddef>
#include <type_traits>

#include <gflow/transport/transport.hpp>

namespace gflow_test {

// Declarations only: -fsyntax-only never needs the definitions.
template <class Space, template <class> class CanReduce>
struct fake_transport {
  using memory_space = Space;
  struct request {};
  template <class E>
  static constexpr bool can_reduce = CanReduce<E>::value;

  int rank() const;
  int size() const;
  template <class T> void all_reduce(T*, std::size_t, gflow::reduce_op);
  template <class T> void all_gather(const T*, T*, std::size_t);
  template <class T> void broadcast(T*, std::size_t, int);
  template <class T> void reduce(T*, std::size_t, gflow::reduce_op, int);
  template <class T> void send(const T*, std::size_t, int);
  template <class T> void recv(T*, std::size_t, int);
  void barrier();
  template <class T> request iall_reduce(T*, std::size_t, gflow::reduce_op);
  template <class T> request iall_gather(const T*, T*, std::size_t);
  template <class T> request ibroadcast(T*, std::size_t, int);
  template <class T> request isend(const T*, std::size_t, int);
  template <class T> request irecv(T*, std::size_t, int);
  void wait(request&);
  fake_transport split(int, int);
};

template <class E>
struct reduces_everything : std::true_type {};
template <class E>
struct reduces_only_fp32 : std::is_same<E, float> {};

/// NCCL-like: buffers in device memory, reduces every wire type.
using device_transport = fake_transport<gflow::device_memory, reduces_everything>;
/// Host memory, but can only sum fp32 (like an MPI without a half-precision MPI_Op).
using fp32_only_transport = fake_transport<gflow::host_memory, reduces_only_fp32>;

/// Not a transport at all: no collectives.
struct not_a_transport {
  using memory_space = gflow::host_memory;
  struct request {};
  int rank() const;
  int size() const;
};

}  // namespace gflow_test
