#pragma once
// The sparse message of the Top-k sparsifiers: its layout, its size, the faults a receiver can
// find in it, and the sentence that names each fault in an error. A format, not a kernel: the
// host kernel that validates a message (kernels::unpack_checked, kernels/topk.hpp) and its CUDA
// twin (cuda::message_checker, cuda/topk_engine.cuh) both read it from here.
//
// One message per rank and selection; sizes fixed by the capacity k so that every send / recv /
// all_gather / broadcast has the same byte count on every rank:
//   [header, 24 bytes][k indices of I (u32 or u64)][k values of W]
//   header = u64 count (<= k, entries in use), u32 status (0, or the fault a rank detected
//   upstream), u32 reporter rank, u32 source rank, u32 round; entries past `count` are unused.
// Indices are absolute pool positions, strictly increasing within a message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "../../error.hpp"

namespace gflow::detail::sparse_message {

inline constexpr std::size_t header_bytes = 24;

/// Why a received message was rejected (carried in the header status once detected).
enum class fault_code : std::uint32_t { none = 0, count = 1, index = 2, order = 3, value = 4, status = 5 };

inline const char* parameter_of(fault_code f) noexcept {
  switch (f) {
    case fault_code::none: return "message";
    case fault_code::count: return "count";
    case fault_code::index: return "index";
    case fault_code::order: return "index";
    case fault_code::value: return "value";
    case fault_code::status: return "status";
  }
  return "message";
}

struct header {
  std::uint64_t count = 0;
  std::uint32_t status = 0;
  std::uint32_t reporter = 0;
  std::uint32_t source = 0;
  std::uint32_t round = 0;
};
static_assert(sizeof(header) == header_bytes);

/// Bytes of a message of capacity k.
constexpr std::size_t bytes(std::size_t k, std::size_t index_bytes, std::size_t value_bytes) noexcept {
  return header_bytes + k * (index_bytes + value_bytes);
}

/// Writes `count` (<= k) pairs and the header into msg (bytes(k, sizeof(I), sizeof(W)) bytes).
template <class I, class W>
void pack(unsigned char* msg, std::size_t k, const I* idx, const W* val, std::size_t count, header h = {}) noexcept {
  h.count = count;
  std::memcpy(msg, &h, sizeof h);
  if (count) {
    std::memcpy(msg + header_bytes, idx, count * sizeof(I));
    std::memcpy(msg + header_bytes + k * sizeof(I), val, count * sizeof(W));
  }
}

inline header read_header(const unsigned char* msg) noexcept {
  header h;
  std::memcpy(&h, msg, sizeof h);
  return h;
}

/// What unpack_checked found.
struct unpack_result {
  std::size_t count = 0;               // entries unpacked (0 when rejected)
  fault_code fault = fault_code::none;
  std::uint64_t position = 0;          // entry at fault (count: the count received)
  std::uint64_t bad_index = 0;         // the offending index (index / order faults)
  sparse_message::header header{};     // as received (qualified: the member shares the type's name)
  [[nodiscard]] bool ok() const noexcept { return fault == fault_code::none; }
};

/// One sentence on a rejected message, for the error text.
inline std::string describe(const unpack_result& r, std::size_t k, std::uint64_t lo, std::uint64_t hi) {
  switch (r.fault) {
    case fault_code::none: return "the message is valid.";
    case fault_code::count:
      return fmt::format("it claims {} entries, more than the capacity k = {}.", r.position, k);
    case fault_code::index:
      return fmt::format("entry {} has index {}, outside the selection range ["
             "{}, {}).", r.position, r.bad_index, lo, hi);
    case fault_code::order:
      return fmt::format("entry {} has index {}"
             ", not greater than the entry before it (a duplicate or out-of-order index).", r.position, r.bad_index);
    case fault_code::value: return fmt::format("entry {} (index {}) has a NaN value.", r.position, r.bad_index);
    case fault_code::status: return fmt::format("its header carries fault status {}.", r.header.status);
  }
  return "it is malformed.";
}

}  // namespace gflow::detail::sparse_message
