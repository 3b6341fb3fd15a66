#pragma once
// gflow::mpi, part 2 of 6: what exists twice because of MPI-3 vs MPI-4.
//
// Counts: MPI-3 interfaces take `int` counts. With an MPI-4 library (MPI_VERSION >= 4) the
// large-count `_c` functions are used and any std::size_t count that fits MPI_Count works;
// with MPI-3 (Open MPI 4.1, e.g. Debian bookworm) a count above INT_MAX raises
// gflow::invalid_argument("count"): split the buffer, or build against an MPI-4 library.
//
// The MPI-4 `_c` forms and the MPI-3 forms below are deliberate twins, one `#if` each, so that
// the transport reads as plain MPI; the `duplicates` tool lists them, and that is expected.
#include <climits>
#include <cstddef>
#include <limits>
#include <string>

#include "../../error.hpp"
#include "check.hpp"

namespace gflow::mpi {

#if defined(MPI_VERSION) && MPI_VERSION >= 4
inline constexpr bool has_large_count = true;
using count_t = MPI_Count;
#else
inline constexpr bool has_large_count = false;
using count_t = int;
#endif

namespace detail {

/// A user-defined MPI_Op's function over `Combine(in, inout, n)` (a 16-bit sum, max or min).
#if defined(MPI_VERSION) && MPI_VERSION >= 4
template <void (*Combine)(void*, void*, std::size_t)>
void user_fn(void* in, void* inout, MPI_Count* len, MPI_Datatype*) {
  Combine(in, inout, static_cast<std::size_t>(*len));
}
inline int op_create(void (*fn)(void*, void*, MPI_Count*, MPI_Datatype*), MPI_Op* op) { return MPI_Op_create_c(fn, 1, op); }
#else
template <void (*Combine)(void*, void*, std::size_t)>
void user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  Combine(in, inout, static_cast<std::size_t>(*len));
}
inline int op_create(void (*fn)(void*, void*, int*, MPI_Datatype*), MPI_Op* op) { return MPI_Op_create(fn, 1, op); }
#endif

// One #if for the thirteen calls, so the transport reads as plain MPI.
#if defined(MPI_VERSION) && MPI_VERSION >= 4
inline int allreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m) { return MPI_Allreduce_c(MPI_IN_PLACE, b, c, t, o, m); }
inline int iallreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m, MPI_Request* r) { return MPI_Iallreduce_c(MPI_IN_PLACE, b, c, t, o, m, r); }
inline int allgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m) { return MPI_Allgather_c(s, c, t, b, c, t, m); }
inline int iallgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m, MPI_Request* r) { return MPI_Iallgather_c(s, c, t, b, c, t, m, r); }
inline int bcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m) { return MPI_Bcast_c(b, c, t, root, m); }
inline int ibcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ibcast_c(b, c, t, root, m, r); }
inline int reduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m) { return MPI_Reduce_c(s, b, c, t, o, root, m); }
inline int ireduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ireduce_c(s, b, c, t, o, root, m, r); }
inline int send(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m) { return MPI_Send_c(b, c, t, peer, tag, m); }
inline int isend(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Isend_c(b, c, t, peer, tag, m, r); }
inline int irecv(void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Irecv_c(b, c, t, peer, tag, m, r); }
inline int get_count(const MPI_Status* st, MPI_Datatype t, count_t* c) { return MPI_Get_count_c(st, t, c); }
#else
inline int allreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m) { return MPI_Allreduce(MPI_IN_PLACE, b, c, t, o, m); }
inline int iallreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m, MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, b, c, t, o, m, r); }
inline int allgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m) { return MPI_Allgather(s, c, t, b, c, t, m); }
inline int iallgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m, MPI_Request* r) { return MPI_Iallgather(s, c, t, b, c, t, m, r); }
inline int bcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m) { return MPI_Bcast(b, c, t, root, m); }
inline int ibcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ibcast(b, c, t, root, m, r); }
inline int reduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m) { return MPI_Reduce(s, b, c, t, o, root, m); }
inline int ireduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ireduce(s, b, c, t, o, root, m, r); }
inline int send(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m) { return MPI_Send(b, c, t, peer, tag, m); }
inline int isend(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Isend(b, c, t, peer, tag, m, r); }
inline int irecv(void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Irecv(b, c, t, peer, tag, m, r); }
inline int get_count(const MPI_Status* st, MPI_Datatype t, count_t* c) { return MPI_Get_count(st, t, c); }
#endif

/// n as this MPI's count type, or invalid_argument("count") naming `op` when it does not fit.
inline count_t count(std::size_t n, const char* op) {
#if defined(MPI_VERSION) && MPI_VERSION >= 4
  if (n > static_cast<std::size_t>(std::numeric_limits<MPI_Count>::max()))
    throw invalid_argument("count", fmt::format("{}: {} elements exceed MPI_Count.", op, n), "split the buffer.");
  return static_cast<MPI_Count>(n);
#else
  if (n > static_cast<std::size_t>(INT_MAX))
    throw invalid_argument("count",
                           fmt::format("{}: {} elements exceed INT_MAX ({}"
                               "), the largest count this MPI-{}.{}"
                               " library accepts (its large-count _c functions need MPI 4).", op, n, INT_MAX, MPI_VERSION, MPI_SUBVERSION),
                           "split the buffer into pieces of at most INT_MAX elements, or build against an MPI-4 library.");
  return static_cast<int>(n);
#endif
}

}  // namespace detail
}  // namespace gflow::mpi
