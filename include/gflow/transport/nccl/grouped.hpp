#pragma once
// gflow::nccl, the collectives NCCL has no single call for, as members of the transport (a CRTP
// base of gflow::nccl::transport, which lets it use its issue() and blocking()):
//   - all_to_all / all_to_allv / all_gatherv (gflow::variable_transport; nccl/variable.hpp):
//     blocking, one group of ncclSend / ncclRecv per peer;
//   - reduce_scatter / ireduce_scatter / all_gatherv_in_place (gflow::sharding_transport;
//     nccl/shards.hpp): one ncclReduceScatter / ncclAllGather where the blocks are equal, else one
//     group of an ncclReduce / ncclBroadcast per block.
// Packed blocks: counts[q] elements for rank q, in rank order; every rank passes the same counts.
// (transport/nccl.hpp includes all the parts; include that one.)
#include <cstddef>

#include "../../dtype.hpp"
#include "../transport.hpp"
#include "check.hpp"
#include "shards.hpp"
#include "variable.hpp"

namespace gflow::nccl::detail {

template <class Derived>
class grouped_collectives {
 public:
  template <wire_element T>
  void all_to_all(const T* s, T* r, std::size_t n) {
    exchange("all_to_all", s, r, blocks::uniform(n, self().size()), blocks::uniform(n, self().size()));
  }
  template <wire_element T>
  void all_to_allv(const T* s, const std::size_t* sc, T* r, const std::size_t* rc) {
    exchange("all_to_allv", s, r, blocks::packed(sc, self().size()), blocks::packed(rc, self().size()));
  }
  template <wire_element T>
  void all_gatherv(const T* s, std::size_t n, T* r, const std::size_t* c) {
    exchange("all_gatherv", s, r, blocks::same(n, self().size()), blocks::packed(c, self().size()));
  }

  template <wire_element T>
  auto ireduce_scatter(const T* s, T* r, const std::size_t* c, reduce_op op) {
    Derived& d = self();
    return d.issue("reduce_scatter", "reduce_scatter (ncclReduceScatter, or one ncclReduce per block in a group)",
                   [&] { return reduce_scatter_blocks(s, r, blocks::packed(c, d.size()), red_op(op), d.comm(), d.stream()); });
  }
  template <wire_element T>
  void reduce_scatter(const T* s, T* r, const std::size_t* c, reduce_op op) {
    self().blocking("reduce_scatter", [&] { return ireduce_scatter(s, r, c, op); });
  }
  template <wire_element T>
  void all_gatherv_in_place(T* b, const std::size_t* c) {
    Derived& d = self();
    d.blocking("all_gatherv_in_place", [&] {
      return d.issue("all_gatherv_in_place", "all_gatherv_in_place (ncclAllGather, or one ncclBroadcast per block in a group)",
                     [&] { return all_gather_blocks_in_place(b, blocks::packed(c, d.size()), d.rank(), d.comm(), d.stream()); });
    });
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  template <class T>
  void exchange(const char* op, const T* s, T* r, const blocks& sb, const blocks& rb) {
    Derived& d = self();
    d.blocking(op, [&] { return d.issue(op, "ncclSend / ncclRecv in a group", [&] { return send_recv_blocks(s, r, sb, rb, d.comm(), d.stream()); }); });
  }
};

}  // namespace gflow::nccl::detail
