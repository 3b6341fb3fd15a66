#pragma once
// gflow::nccl, the variable-size collectives (all_to_all, all_to_allv, all_gatherv; the
// gflow::variable_transport concept): NCCL has none of them as one call, so each is one
// ncclGroupStart / ncclGroupEnd of an ncclSend and an ncclRecv per peer (empty blocks skipped),
// enqueued on the transport's stream like its other collectives (timeouts, aborts and error texts
// as theirs: transport/nccl.hpp). Every rank must pass matching counts, as with MPI_Alltoallv.
// (transport/nccl.hpp includes all the parts; include that one.)
#include <cstddef>
#include <vector>

#include "check.hpp"

namespace gflow::nccl::detail {

/// Where each peer's block lies in a buffer: element offset and count per rank.
struct blocks {
  std::vector<std::size_t> off, cnt;
  /// Block q at q * n, n elements each (all_to_all).
  static blocks uniform(std::size_t n, int P) {
    blocks b;
    for (int q = 0; q < P; ++q) {
      b.off.push_back(static_cast<std::size_t>(q) * n);
      b.cnt.push_back(n);
    }
    return b;
  }
  /// counts[q] elements each, packed in rank order (all_to_allv, all_gatherv's receive side).
  static blocks packed(const std::size_t* counts, int P) {
    blocks b;
    std::size_t at = 0;
    for (int q = 0; q < P; ++q) {
      b.off.push_back(at);
      b.cnt.push_back(counts[q]);
      at += counts[q];
    }
    return b;
  }
  /// The same n elements for every peer (all_gatherv's send side).
  static blocks same(std::size_t n, int P) {
    blocks b;
    b.off.assign(static_cast<std::size_t>(P), 0);
    b.cnt.assign(static_cast<std::size_t>(P), n);
    return b;
  }
};

/// One group of ncclSend (send's block for q) and ncclRecv (recv's block from q) per peer q,
/// self included; returns the first failure (the group is always closed).
template <class T>
ncclResult_t send_recv_blocks(const T* send, T* recv, const blocks& s, const blocks& r, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
  const int P = static_cast<int>(s.cnt.size());
  for (int q = 0; q < P && first == ncclSuccess; ++q) {
    const auto u = static_cast<std::size_t>(q);
    if (s.cnt[u]) first = ncclSend(send + s.off[u], s.cnt[u], data_type<T>(), q, comm, stream);
    if (first == ncclSuccess && r.cnt[u]) first = ncclRecv(recv + r.off[u], r.cnt[u], data_type<T>(), q, comm, stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

}  // namespace gflow::nccl::detail
