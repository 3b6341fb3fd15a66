#pragma once
// The transport concept: the collectives the exchanger and its policies use, over one group of
// ranks. No virtual calls: the Exchanger is a template over its transport, and each
// implementation below is a concrete class checked against this concept right after its
// definition.
//
//   rank(), size()                       this rank and the group size
//   all_reduce(buf, n, op)               in place, every rank gets the reduction
//   all_gather(send, recv, n)            recv holds n * size() elements, in rank order
//   broadcast(buf, n, root)              root's buf to every rank
//   reduce(buf, n, op, root)             in place; the result lands in root's buf only
//   send(buf, n, peer) / recv(buf, n, peer)
//   split(color, key)                    sub-group of the ranks with the same color, ordered by key
//   barrier()
//   all_to_all(send, recv, n)            block q of send (n elements) to rank q; recv block q from rank q
//   all_to_allv(send, scounts, recv, rcounts)
//                                        packed blocks: scounts[q] elements to rank q, rcounts[q]
//                                        from rank q (each pair must agree)
//   all_gatherv(send, n, recv, counts)   rank q's n = counts[q] elements, packed in rank order
//   (these three: the concept variable_transport below, which Sparsifier<OkTopK> requires)
//   reduce_scatter(send, recv, counts, op)
//                                        send holds counts[0] + ... + counts[P-1] elements in P packed
//                                        blocks; recv gets block rank() reduced over every rank
//   all_gatherv_in_place(buf, counts)    buf holds P packed blocks; block q comes from rank q (its
//                                        block in its own buf), every rank ends with all of them
//   (these two and ireduce_scatter: the concept sharding_transport, for Sharding<ReduceScatter>)
//   i-forms (iall_reduce, iall_gather, ibroadcast, isend, irecv) return a request; wait(req)
//   completes it. Buffers must stay valid until then.
//
// Element types: every wire_element (dtype.hpp). can_reduce<T> says whether all_reduce/reduce
// accept T; the exchanger checks it at compile time for its wire type.
// memory_space: host_memory (buffers are host pointers) or device_memory (CUDA pointers).
#include <concepts>
#include <cstddef>
#include <cstdint>

#include <string>

#include "../dtype.hpp"
#include "../error.hpp"

namespace gflow {

template <class T>
concept transport = requires(T& t, const T& ct, float* buf, const float* cbuf, std::size_t n, int peer,
                             typename T::request& req) {
  typename T::memory_space;
  typename T::request;
  { ct.rank() } -> std::same_as<int>;
  { ct.size() } -> std::same_as<int>;
  t.all_reduce(buf, n, reduce_op::sum);
  t.all_gather(cbuf, buf, n);
  t.broadcast(buf, n, peer);
  t.reduce(buf, n, reduce_op::sum, peer);
  t.send(cbuf, n, peer);
  t.recv(buf, n, peer);
  t.barrier();
  { t.iall_reduce(buf, n, reduce_op::sum) } -> std::same_as<typename T::request>;
  { t.iall_gather(cbuf, buf, n) } -> std::same_as<typename T::request>;
  { t.ibroadcast(buf, n, peer) } -> std::same_as<typename T::request>;
  { t.isend(cbuf, n, peer) } -> std::same_as<typename T::request>;
  { t.irecv(buf, n, peer) } -> std::same_as<typename T::request>;
  t.wait(req);
  { t.split(peer, peer) } -> std::same_as<T>;
  { T::template can_reduce<float> } -> std::convertible_to<bool>;
};

/// A transport with the variable-size collectives (all_to_all, all_to_allv, all_gatherv) that
/// Sparsifier<OkTopK<d>> needs. Every built-in transport has them; a transport written outside
/// gflow meets gflow::transport without them and then serves every other scheme.
template <class T>
concept variable_transport = transport<T> && requires(T& t, const std::uint8_t* cbuf, std::uint8_t* buf, std::size_t n, const std::size_t* counts) {
  t.all_to_all(cbuf, buf, n);
  t.all_to_allv(cbuf, counts, buf, counts);
  t.all_gatherv(cbuf, n, buf, counts);
};

/// A transport with the collectives Sharding<ReduceScatter> needs: reduce_scatter (blocking and
/// non-blocking, for Overlap) and the in-place all_gatherv of ex.gather_shards(). The MPI and
/// in-process transports have them.
template <class T>
concept sharding_transport = transport<T> && requires(T& t, const float* cbuf, float* buf, const std::size_t* counts) {
  t.reduce_scatter(cbuf, buf, counts, reduce_op::sum);
  { t.ireduce_scatter(cbuf, buf, counts, reduce_op::sum) } -> std::same_as<typename T::request>;
  t.all_gatherv_in_place(buf, counts);
};

namespace detail {
/// The argument check every transport makes on a peer or root: p must be a rank of the group.
inline void check_peer_rank(int p, int size, const char* what) {
  if (p < 0 || p >= size)
    throw invalid_argument(what, fmt::format("{} {} is outside the group of {} ranks.", what, p, size),
                           "pass a rank in [0, size()).");
}
}  // namespace detail

/// What the built-in transports declare alike: their memory space, and that they sum every wire
/// element (a transport that sums fewer types declares its own can_reduce instead).
template <class Space>
struct transport_base {
  using memory_space = Space;
  template <class E>
  static constexpr bool can_reduce = wire_element<E>;
};

/// True when transport T can sum elements of type E (the exchanger's wire type).
template <class T, class E>
concept reduces = transport<T> && T::template can_reduce<E>;

}  // namespace gflow
