#pragma once
// The messages of Sparsifier<OkTopK<d>> (engines/oktopk/): how a rank's variable-size block is
// laid out, and the checks a receiver makes before anything is used. A format, not a kernel.
//
// Each block is a sparse message (support/sparse_message.hpp) whose capacity equals its count:
//   [header, 24 bytes][count indices of I][count values of W], header.count == count.
// The count travels first, apart from the block (split-and-reduce: an all_to_all of one u64 per
// peer; balance-and-allgatherv: an all_gather of each rank's 24-byte announcement, from which
// every rank computes every block's count, and which also carries a fault mark), so that the
// receiver knows the block's size before the variable collective.
//   check_count : a received count must not exceed `cap` (what the sender can hold).
//   check_block : a received block must hold exactly bytes(count) bytes, a header whose count
//                 is that count and status 0, indices strictly increasing in [lo, hi), no NaN.
// The decoder is fuzzed (tests/fuzz/fuzz_oktopk_block.cpp).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "sparse_message.hpp"

namespace gflow::detail::oktopk_message {

/// What each rank all-gathers before the result blocks (24 bytes): how many of its reduced sums lie
/// above the global cut's level, and how many at it (at most the cut's allowance, and at most
/// 2^32 - 1: a rank never takes more at the level than it announced), or, status != 0, the fault
/// mark of a split block it rejected (status, reporter, source as in sparse_message::header).
/// engines/oktopk/cut.hpp turns every rank's announcement into its block's count.
struct announcement {
  std::uint64_t above = 0;
  std::uint32_t status = 0;
  std::uint32_t reporter = 0;
  std::uint32_t source = 0;
  std::uint32_t at_cut = 0;
};
static_assert(sizeof(announcement) == sparse_message::header_bytes);

/// Bytes of a block of `count` entries.
constexpr std::size_t block_bytes(std::size_t count, std::size_t index_bytes, std::size_t value_bytes) noexcept {
  return sparse_message::bytes(count, index_bytes, value_bytes);
}

/// A count received ahead of its block: fault `count` (position = the count) when above cap.
inline sparse_message::unpack_result check_count(std::uint64_t count, std::uint64_t cap) noexcept {
  sparse_message::unpack_result r;
  if (count > cap) {
    r.fault = sparse_message::fault_code::count;
    r.position = count;
  }
  return r;
}

/// Checks a received block of `nbytes` bytes announced as `count` entries (count <= cap already
/// checked) and copies its entries to idx / val only when all of it is valid.
template <class I, class W, class Unpack>
sparse_message::unpack_result check_block(const unsigned char* msg, std::size_t nbytes, std::size_t count, std::uint64_t lo, std::uint64_t hi, I* idx,
                                          W* val, Unpack unpack) noexcept {
  sparse_message::unpack_result r;
  if (nbytes < sparse_message::header_bytes || nbytes != block_bytes(count, sizeof(I), sizeof(W))) {
    r.fault = sparse_message::fault_code::count;
    r.position = count;
    return r;
  }
  r.header = sparse_message::read_header(msg);
  if (r.header.status == 0 && r.header.count != count) {  // the block disagrees with its announced count
    r.fault = sparse_message::fault_code::count;
    r.position = r.header.count;
    return r;
  }
  return unpack(msg, count, lo, hi, idx, val);
}

/// One sentence on a rejected block or count.
inline std::string describe(const sparse_message::unpack_result& r, std::size_t announced, std::uint64_t lo, std::uint64_t hi) {
  if (r.fault == sparse_message::fault_code::count)
    return fmt::format("it claims {} entries where {} were announced (at most the sender's capacity, and the block's size must match).", r.position,
                       announced);
  return sparse_message::describe(r, announced, lo, hi);
}

}  // namespace gflow::detail::oktopk_message
