#pragma once
// gflow::nccl, part 1 of 3: <nccl.h>, NCCL's names for gflow's element types and reductions, and
// the check every NCCL call goes through (a typed error with NCCL's text and a fix).
// (transport/nccl.hpp includes all the parts; include that one.)
#include <nccl.h>

#include <cstddef>
#include <iterator>
#include <string>

#include "../../dtype.hpp"
#include "../../error.hpp"

namespace gflow::nccl::detail {

/// NCCL's data type for each gflow::dtype, indexed by it. NCCL reduces every type gflow moves.
inline constexpr ncclDataType_t data_types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16, ncclInt32,
                                                ncclInt64,   ncclUint32,  ncclUint64,  ncclUint8};
static_assert(std::size(data_types) == static_cast<std::size_t>(dtype::u8) + 1,
              "gflow::nccl::detail::data_types: one entry per gflow::dtype, in the enum's order (u8 last).");

/// NCCL's data type for a gflow wire element.
template <wire_element T>
constexpr ncclDataType_t data_type() noexcept {
  return data_types[static_cast<std::size_t>(dtype_of_v<T>)];
}

constexpr ncclRedOp_t red_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

inline const char* fix_for(ncclResult_t r) noexcept {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check that the buffers are device memory of this rank's device and "
             "that no earlier kernel faulted (run under compute-sanitizer); NCCL_DEBUG=INFO shows the CUDA error.";
    case ncclSystemError:
      return "a system call failed (sockets, shared memory, /dev/shm size, ulimits): check the host setup; "
             "NCCL_DEBUG=INFO shows which call.";
    case ncclInternalError:
      return "NCCL hit an internal error: rerun with NCCL_DEBUG=INFO and report it with that log.";
    case ncclInvalidArgument:
      return "check the arguments: device pointers on this rank's device, element counts, and root / peer ranks "
             "in [0, size()).";
    case ncclInvalidUsage:
      return "every rank must issue the same collectives in the same order with the same counts and types, "
             "and a communicator must not be used by two threads at once.";
    case ncclRemoteError:
      return "a peer rank exited or the network failed: the communicator is unusable; destroy the transports "
             "and restart the job (or the failed ranks).";
    case ncclInProgress:
      return "the communicator is non-blocking; gflow::nccl::transport needs a blocking communicator "
             "(ncclConfig_t::blocking = 1, the default).";
    default:
      return "rerun with NCCL_DEBUG=INFO to see what NCCL did.";
  }
}

/// Throws gflow::transport_error for a failed NCCL call; `who` says which rank.
[[noreturn]] inline void fail(ncclResult_t r, const char* op, const std::string& who, ncclComm_t comm) {
  std::string msg = std::string(op) + " failed on " + who + ": " + ncclGetErrorString(r) + ".";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" NCCL: ") + last;
  throw transport_error(op, msg, fix_for(r));
}

}  // namespace gflow::nccl::detail
