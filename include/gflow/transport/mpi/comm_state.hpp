#pragma once
// gflow::mpi, part 4 of 6: the state a transport and its copies share — collective numbers, the
// control communicator the stall inspector talks on, its messages, and the issuing thread.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "../call_thread.hpp"
#include "check.hpp"
#include "../../error.hpp"

namespace gflow::mpi::detail {

inline constexpr std::uint64_t no_seq = ~std::uint64_t{0};
// Tags of the stall inspector's messages, on the control communicator only.
inline constexpr int tag_query = 1;   // {collective number asked about}
inline constexpr int tag_reply = 2;   // {asked, collectives started, waiting kind, waiting number, op code, peer}
inline constexpr int tag_notice = 3;  // {collective given up on, n, missing rank 1..n}

// Operation names travel as their index here.
inline constexpr const char* op_names[] = {"?",     "all_reduce", "iall_reduce", "all_gather", "iall_gather", "broadcast",
                                           "ibroadcast", "reduce", "ireduce", "barrier", "split", "send", "recv", "isend", "irecv", "wait",
                                           "all_to_all", "all_to_allv", "all_gatherv"};
inline std::uint64_t op_code(const char* op) {
  for (std::size_t i = 1; i < std::size(op_names); ++i)
    if (std::strcmp(op, op_names[i]) == 0) return i;
  return 0;
}
inline const char* op_name(std::uint64_t code) { return code < std::size(op_names) ? op_names[code] : op_names[0]; }

/// What this rank is blocked in, as it tells an inspector.
struct waiting_info {
  std::uint64_t kind = 0;  // 0: nothing, 1: a collective, 2: send / recv
  std::uint64_t seq = no_seq;
  std::uint64_t op = 0;
  int peer = -1;
};

/// "Rank `rank` gave up on collective `seq` and found `missing` had not arrived."
struct notice {
  int rank = -1;
  std::uint64_t seq = no_seq;
  std::vector<int> missing;
};

/// Shared by a transport and its copies (they use the same communicator).
struct comm_state {
  MPI_Comm ctl = MPI_COMM_NULL;  // duplicate of the communicator: stall-inspector messages only
  std::uint64_t seq = 0;         // collectives started on the communicator
  waiting_info waiting;
  std::string broken;  // why the communicator was abandoned (after a timeout); empty while usable
  std::vector<notice> notices;
  struct outgoing {
    MPI_Request r = MPI_REQUEST_NULL;
    std::unique_ptr<std::uint64_t[]> buf;
  };
  std::list<outgoing> sends;  // control messages in flight (their buffers must outlive them)
  bool thread_multiple = false;  // MPI provides MPI_THREAD_MULTIPLE: timed collectives run on `issuer`
  std::unique_ptr<gflow::detail::call_thread> issuer;  // made on the first timed blocking collective
  std::chrono::milliseconds linger{0};                  // the transport's grace period when it was made

  comm_state() = default;
  comm_state(const comm_state&) = delete;
  comm_state& operator=(const comm_state&) = delete;
  ~comm_state() {
    // Joins the issuing thread; one still in a collective abandoned after a timeout gets `linger`
    // to return (the late ranks may be arriving now), and is detached after that.
    if (issuer) issuer->shutdown(linger);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& s : sends) {
      int done = 0;
      if (s.r != MPI_REQUEST_NULL && MPI_Test(&s.r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        MPI_Request_free(&s.r);  // MPI completes it on its own; the few bytes it reads must stay
        (void)s.buf.release();
      }
    }
    if (ctl != MPI_COMM_NULL) MPI_Comm_free(&ctl);
  }

  /// Fire-and-forget control message (best effort: a dead peer just never gets it).
  void post(int dest, int tag, std::vector<std::uint64_t> v) {
    outgoing o;
    o.buf = std::make_unique<std::uint64_t[]>(v.size());
    std::copy(v.begin(), v.end(), o.buf.get());
    if (MPI_Isend(o.buf.get(), static_cast<int>(v.size()), MPI_UINT64_T, dest, tag, ctl, &o.r) == MPI_SUCCESS) sends.push_back(std::move(o));
  }

  /// Answers queries, collects notices, forgets completed sends. Best effort: errors are ignored
  /// (this runs while waiting for something else, which reports its own failures).
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctl, &flag, &st) != MPI_SUCCESS || !flag) break;
      std::uint64_t asked = 0;
      if (MPI_Recv(&asked, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      post(st.MPI_SOURCE, tag_reply, {asked, seq, waiting.kind, waiting.seq, waiting.op, static_cast<std::uint64_t>(waiting.peer)});
    }
    for (;;) {
      int flag = 0, n = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, tag_notice, ctl, &flag, &st) != MPI_SUCCESS || !flag) break;
      if (MPI_Get_count(&st, MPI_UINT64_T, &n) != MPI_SUCCESS || n < 2) break;
      std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
      if (MPI_Recv(v.data(), n, MPI_UINT64_T, st.MPI_SOURCE, tag_notice, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      notice g{st.MPI_SOURCE, v[0], {}};
      for (std::size_t i = 2; i < v.size() && i - 2 < v[1]; ++i) g.missing.push_back(static_cast<int>(v[i]));
      notices.push_back(std::move(g));
    }
    for (auto it = sends.begin(); it != sends.end();) {
      int done = 0;
      if (MPI_Test(&it->r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) it = sends.erase(it);
      else ++it;
    }
  }

  [[nodiscard]] const notice* gave_up_on(std::uint64_t s) const {
    for (const auto& g : notices)
      if (g.seq == s) return &g;
    return nullptr;
  }
};

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", (i ? ", " : ""), ranks[i]);
  return s;
}

/// Frees an owned communicator, unless MPI is already finalized (then it is gone anyway).
struct comm_deleter {
  void operator()(MPI_Comm* c) const noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *c != MPI_COMM_NULL) MPI_Comm_free(c);
    delete c;
  }
};

}  // namespace gflow::mpi::detail
