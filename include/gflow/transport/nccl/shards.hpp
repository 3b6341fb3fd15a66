#pragma once
// gflow::nccl, the collectives of Sharding<ReduceScatter> (the gflow::sharding_transport
// concept): reduce_scatter of packed blocks (counts[q] elements for rank q) and the in-place
// all_gatherv of such blocks. Where every block has the same count they are one
// ncclReduceScatter / ncclAllGather (in place: rank q's block at q * n). Otherwise (a bucket of n
// elements split P ways holds n / P, one more for the first n mod P ranks) NCCL has no call for
// them, and each is one ncclGroupStart / ncclGroupEnd of an ncclReduce (root q, block q) or an
// ncclBroadcast (root q, in place) per rank, as PyTorch's ProcessGroupNCCL does for tensors of
// uneven sizes: each rank sends about the bucket once, against (P - 1) / P of it for the ring's
// reduce-scatter. Enqueued on the transport's stream like its other collectives (timeouts, aborts
// and error texts as theirs: transport/nccl.hpp). Every rank must pass the same counts. NCCL sums
// in an order of its own: the shard holds the allreduce's value, not necessarily its bits.
// (transport/nccl.hpp includes all the parts; include that one.)
#include <cstddef>

#include "check.hpp"
#include "variable.hpp"

namespace gflow::nccl::detail {

/// The count every block has, or 0 when they differ (or are all empty).
inline std::size_t uniform_count(const blocks& b) {
  for (std::size_t c : b.cnt)
    if (c != b.cnt.front()) return 0;
  return b.cnt.empty() ? 0 : b.cnt.front();
}

/// send: the packed blocks; recv: this rank's block of the reduction (b.cnt[rank] elements).
template <class T>
ncclResult_t reduce_scatter_blocks(const T* send, T* recv, const blocks& b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (const std::size_t n = uniform_count(b)) return ncclReduceScatter(send, recv, n, data_type<T>(), op, comm, stream);
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
  for (std::size_t q = 0; q < b.cnt.size() && first == ncclSuccess; ++q)
    if (b.cnt[q]) first = ncclReduce(send + b.off[q], recv, b.cnt[q], data_type<T>(), op, static_cast<int>(q), comm, stream);  // recv: read on root q only
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

/// In place over the packed blocks: rank q's block to every rank.
template <class T>
ncclResult_t all_gather_blocks_in_place(T* buf, const blocks& b, int rank, ncclComm_t comm, cudaStream_t stream) {
  if (const std::size_t n = uniform_count(b))
    return ncclAllGather(buf + b.off[static_cast<std::size_t>(rank)], buf, n, data_type<T>(), comm, stream);
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
  for (std::size_t q = 0; q < b.cnt.size() && first == ncclSuccess; ++q)
    if (b.cnt[q]) first = ncclBroadcast(buf + b.off[q], buf + b.off[q], b.cnt[q], data_type<T>(), static_cast<int>(q), comm, stream);
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

}  // namespace gflow::nccl::detail
