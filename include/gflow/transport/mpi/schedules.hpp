#pragma once
// gflow::mpi: gflow's own schedules for the variable collectives (all_to_allv, all_gatherv) of
// gflow::mpi::transport, built from its isend / irecv and used while its variable window is
// positive (transport::set_variable_window; docs/DESIGN.md, "The variable collectives over MPI").
// They reach the transport's communicator and stall-inspector state as its friend.
//
// The messages carry a tag of their own (tag_variable), so they never match the engines' isend /
// irecv, and a pair of ranks sees them in posting order (MPI's non-overtaking rule), so calls back
// to back never mix (all_to_allv sends a message for every block, empty ones too, so counts that
// disagree fail in the call that has them). Each wait is the transport's wait(request), bounded by
// its timeout as a send's is. If one fails (a timeout, a count that does not match), the receives still posted are
// cancelled, so no message lands in the caller's buffers after the error, and the communicator is
// marked unusable.
#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "check.hpp"
#include "datatypes.hpp"
#include "large_count.hpp"

namespace gflow::mpi {

/// The variable window of transports made without one: all_to_allv and all_gatherv run as gflow's
/// schedule of point-to-point messages with at most this many peers in flight (set_variable_window;
/// docs/DESIGN.md, "The variable collectives over MPI", has the measurements behind the number).
inline constexpr int default_variable_window = 16;
/// all_gatherv runs gflow's schedule while the gathered total is at most this many bytes a rank on
/// average; above, the MPI library's MPI_Allgatherv (its ring moves large blocks at the link's
/// rate; docs/DESIGN.md, "The variable collectives over MPI"). The same on every rank: the counts are.
inline constexpr std::size_t gathered_slice_limit = 64 * 1024;

}  // namespace gflow::mpi

namespace gflow::mpi::detail {

/// The tag of the schedules' messages (the transport's own point-to-point tag is 0x6f6c).
inline constexpr int tag_variable = 0x6f6d;

struct variable_schedules {
  /// Packed offsets of P blocks, in elements.
  static std::vector<std::size_t> offsets(const std::size_t* counts, int P) {
    std::vector<std::size_t> d(static_cast<std::size_t>(P));
    for (std::size_t q = 1; q < d.size(); ++q) d[q] = d[q - 1] + counts[q - 1];
    return d;
  }

  /// A rank's own block with two counts (checked by the transport before either path).
  static mismatch_error own_counts(int me, std::size_t sent, std::size_t expected) {
    return mismatch_error("all_to_allv", fmt::format("rank {} sends itself {} elements but expects {}.", me, sent, expected),
                          "make send_counts[rank] equal recv_counts[rank].");
  }

  /// all_to_allv as point-to-point messages: this rank's own block is copied; step
  /// s = 1 .. P-1 receives rank - s's block and sends rank + s's (Ok-Topk's destination
  /// rotation), at most `window` steps in flight, the oldest completed first:
  /// ceil((P - 1) / window) latencies. Empty blocks are sent too (a message of no elements), so
  /// a send count its receiver does not expect is caught in this call (a short message:
  /// mismatch_error; a long one: MPI_ERR_TRUNCATE, transport_error), never by a later one.
  template <wire_element T, class Tr>
  static void all_to_allv(Tr& t, int window, const T* send, const std::size_t* send_counts, T* recv, const std::size_t* recv_counts) {
    const char* op = "all_to_allv";
    t.refuse_if_broken(op);
    ++t.state_->seq;  // counted as one collective, as the MPI call would be
    const int P = t.size_, me = t.rank_;
    const auto sd = offsets(send_counts, P), rd = offsets(recv_counts, P);
    copy_own<T>(t, op, send + sd[me], recv + rd[me], recv_counts[me]);
    if (P == 1) return;
    const int W = std::min(window, P - 1);
    std::vector<typename Tr::request> flight(2 * static_cast<std::size_t>(W));
    try {
      for (int s = 1; s < P; ++s) {
        auto* pair = flight.data() + 2 * static_cast<std::size_t>((s - 1) % W);
        t.wait(pair[0]);
        t.wait(pair[1]);
        const int from = (me - s + P) % P, to = (me + s) % P;
        post_recv<T>(t, pair[1], op, recv + rd[from], recv_counts[from], from);
        post_send<T>(t, pair[0], op, send + sd[to], send_counts[to], to);
      }
      for (auto& r : flight) t.wait(r);
    } catch (...) {
      abandon(t, flight, op);
      throw;
    }
  }

  /// all_gatherv in two steps, each rank's time bounded by the total, not by the largest block
  /// (OkTopK's result blocks are uneven: a region that holds more of the top-k sends more, and
  /// the owner of a large block is where a ring, or a direct send to every peer, waits):
  ///  1. balance: the packed result, M elements, is cut into P equal slices (slice r: M / P
  ///     elements, one more for r < M % P); each rank sends the parts of its block that lie in
  ///     other ranks' slices to them (balanced blocks move nothing; Ok-Topk's balancing step);
  ///  2. Bruck's concatenation (Bruck et al., "Efficient algorithms for all-to-all communications
  ///     in multiport message-passing systems") over the slices: after the round of distance
  ///     d = 2^j a rank holds slices rank .. rank + 2d - 1 (mod P), received from rank + d while
  ///     it sends its own to rank - d, min(d, P - d) slices each way; a run of slices is one
  ///     message, or two where it wraps past the end. ceil(log2 P) rounds, each completed before
  ///     the next, whose slices it forwards.
  template <wire_element T, class Tr>
  static void concatenate(Tr& t, const T* send, T* recv, const std::size_t* counts) {
    const char* op = "all_gatherv";
    t.refuse_if_broken(op);
    ++t.state_->seq;
    const int P = t.size_, me = t.rank_;
    const auto d0 = offsets(counts, P);
    const std::size_t M = d0[static_cast<std::size_t>(P - 1)] + counts[P - 1];
    copy_own<T>(t, op, send, recv + d0[me], counts[me]);
    if (P == 1 || M == 0) return;
    const std::size_t base = M / static_cast<std::size_t>(P), extra = M % static_cast<std::size_t>(P);
    auto lo = [&](int r) { return base * static_cast<std::size_t>(r) + std::min<std::size_t>(static_cast<std::size_t>(r), extra); };
    std::vector<typename Tr::request> flight;
    flight.reserve(8);
    auto recv_at = [&](std::size_t at, std::size_t n, int peer) { post_recv<T>(t, flight.emplace_back(), op, recv + at, n, peer); };
    auto send_at = [&](std::size_t at, std::size_t n, int peer) { post_send<T>(t, flight.emplace_back(), op, recv + at, n, peer); };
    auto complete = [&] {
      for (auto& r : flight) t.wait(r);
      flight.clear();
    };
    try {
      // 1. Balance: what block q holds of slice r.
      const std::size_t mine_b = d0[me], mine_e = mine_b + counts[me], slice_b = lo(me), slice_e = lo(me + 1);
      for (int q = 0; q < P; ++q) {
        if (q == me) continue;
        const std::size_t qb = d0[q], qe = qb + counts[q];
        if (const std::size_t b = std::max(qb, slice_b), e = std::min(qe, slice_e); b < e) recv_at(b, e - b, q);
        if (const std::size_t b = std::max(mine_b, lo(q)), e = std::min(mine_e, lo(q + 1)); b < e) send_at(b, e - b, q);
      }
      complete();
      // 2. Bruck's rounds over the slices.
      auto run = [&](int first, int len, auto post, int peer) {
        const int end = first + len;
        if (end <= P) {
          if (lo(end) > lo(first)) post(lo(first), lo(end) - lo(first), peer);
          return;
        }
        if (M > lo(first)) post(lo(first), M - lo(first), peer);
        if (lo(end - P) > 0) post(std::size_t{0}, lo(end - P), peer);
      };
      for (int d = 1; d < P; d *= 2) {
        const int len = std::min(d, P - d);
        run((me + d) % P, len, recv_at, (me + d) % P);
        run(me, len, send_at, (me - d + P) % P);
        complete();
      }
    } catch (...) {
      abandon(t, flight, op);
      throw;
    }
  }

 private:
  // This rank's own block, through MPI as every other block: the buffers may be device memory (a
  // CUDA-aware MPI under mpi_device's direct path), which host code must not touch.
  template <wire_element T, class Tr>
  static void copy_own(Tr& t, const char* op, const T* from, T* to, std::size_t n) {
    if (n == 0 || from == to) return;
    std::array<typename Tr::request, 2> own;
    try {
      post_recv<T>(t, own[0], op, to, n, t.rank_);
      post_send<T>(t, own[1], op, from, n, t.rank_);
      for (auto& r : own) t.wait(r);
    } catch (...) {
      abandon(t, own, op);
      throw;
    }
  }
  template <wire_element T, class Tr>
  static void post_recv(Tr& t, typename Tr::request& slot, const char* op, T* buf, std::size_t n, int peer) {
    slot = t.start_p2p(op, dtype_of_v<T>, n, peer);
    slot.recv_type = datatype<T>();
    slot.recv_count = count(n, op);
    t.check(irecv(buf, slot.recv_count, slot.recv_type, peer, tag_variable, t.comm_, &slot.r), op);
  }
  template <wire_element T, class Tr>
  static void post_send(Tr& t, typename Tr::request& slot, const char* op, const T* buf, std::size_t n, int peer) {
    slot = t.start_p2p(op, dtype_of_v<T>, n, peer);
    t.check(isend(buf, count(n, op), datatype<T>(), peer, tag_variable, t.comm_, &slot.r), op);
  }
  // After a failure part way: the receives still posted are cancelled (nothing lands in the
  // caller's buffers later), the sends released (MPI may still read a send buffer until the peer
  // takes the message: keep it alive, as after a timeout, or end the process), the communicator
  // marked unusable.
  template <class Tr, class Requests>
  static void abandon(Tr& t, Requests& flight, const char* op) {
    for (auto& r : flight)
      if (r.r != MPI_REQUEST_NULL) {
        if (r.recv_type != MPI_DATATYPE_NULL) {
          MPI_Cancel(&r.r);
          MPI_Wait(&r.r, MPI_STATUS_IGNORE);
        } else {
          MPI_Request_free(&r.r);
        }
      }
    if (t.state_->broken.empty()) t.state_->broken = fmt::format("{} failed part way (gflow's point-to-point schedule)", op);
  }
};

}  // namespace gflow::mpi::detail
