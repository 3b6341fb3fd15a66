#pragma once
// gflow::mpi, part 5 of 6: the timed path and the stall inspector (Horovod's idea), the base of
// gflow::mpi::transport.
//
// Every blocking wait (the blocking collectives, send, recv, barrier, split, wait(request)) is
// bounded by the transport's timeout when it is non-zero. A blocking collective (all_reduce,
// all_gather, broadcast, reduce, barrier) is the blocking MPI call, made on the transport's
// issuing thread (call_thread.hpp) while the calling thread sleeps until it returns or the
// deadline passes; point-to-point operations and wait(request) poll MPI_Test. Both waits are one
// loop (wait_bounded): it answers other ranks' stall queries every service_interval(), fails at
// once on a notice that another rank gave up on this collective, and runs the stall inspector
// at the deadline.
//   The inspector asks every other rank (point to point: the peer), over a duplicate of the
// communicator kept for this, how many collectives it has started and what it is waiting in;
// ranks that are themselves waiting in gflow answer within a few milliseconds, and a grace
// period later (timeout / 5, clamped to [100 ms, 5 s]) gflow::timeout_error names the operation,
// its number and the ranks that did not arrive: those that answered from an earlier point and
// those that did not answer at all (computing outside gflow, stuck, or exited). The rank that
// gives up tells the others, so ranks waiting in the same collective fail at once instead of
// each waiting out its own timeout. MPI cannot cancel a collective: after a timeout the issuing
// thread stays blocked in it, and the transport (and copies sharing its communicator) refuses
// every further operation with transport_error.
//   Why a thread (docs/DESIGN.md "Timeouts" has the figures): Open MPI's non-blocking
// collectives (libnbc) are slower than its tuned blocking ones — polling MPI_Iallreduce made the
// exchange benchmark 1.1-1.8x slower than a hand-written loop of MPI_Allreduce — and a blocking
// call cannot be bounded on the thread that makes it. The hand-off costs two thread wake-ups per
// collective (microseconds); the waiting thread takes no CPU. It needs MPI_THREAD_MULTIPLE
// (gflow::mpi::environment asks for it): the inspector talks on the control communicator while
// the issuing thread is inside the collective. Where MPI provides less, timed collectives fall
// back to the non-blocking call polled with MPI_Test (correct, and slower).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "../call_thread.hpp"
#include "check.hpp"
#include "comm_state.hpp"
#include "large_count.hpp"

namespace gflow::mpi::detail {

class stall_inspector {
 public:
  /// A pending operation. `op` names it in errors; a receive remembers what it expects so a
  /// short message is reported instead of silently leaving the tail of the buffer stale.
  struct request {
    MPI_Request r = MPI_REQUEST_NULL;
    const char* op = "wait";
    MPI_Datatype recv_type = MPI_DATATYPE_NULL;  // set for receives only
    count_t recv_count = 0;
    int peer = -1;                       // send / recv: the other rank
    std::uint64_t seq = no_seq;  // collectives: their number on this communicator
    dtype type = dtype::u8;              // what it moves (for timeout messages)
    std::size_t count = 0;
    std::shared_ptr<const void> hold;    // what a non-blocking v-collective reads until it completes (its int counts)
  };

  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// How long a rank that timed out waits for the others to say where they are.
  [[nodiscard]] std::chrono::milliseconds grace() const noexcept {
    return std::clamp<std::chrono::milliseconds>(timeout_ / 5, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
  }
  /// After a timeout: waits up to `linger` for the collective abandoned on the issuing thread to
  /// return (it does once the late ranks arrive). True when no call of this transport is still
  /// inside MPI. Until then MPI may still write that collective's buffer: keep it (and the
  /// exchanger whose pool it is) alive until settle() returns true, or end the process.
  bool settle(std::chrono::milliseconds linger) { return !state_->issuer || state_->issuer->wait_idle(linger); }

  /// Collectives started on this communicator (the number the next one gets).
  [[nodiscard]] std::uint64_t collectives_started() const noexcept { return state_->seq; }

 protected:
  using clock = std::chrono::steady_clock;

  stall_inspector() = default;
  explicit stall_inspector(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  [[nodiscard]] bool timed() const noexcept { return !detail::smpi && timeout_.count() > 0; }  // SMPI: check.hpp
  [[nodiscard]] std::string where() const { return fmt::format("on rank {} of {}", rank_, size_); }
  void check(int rc, const char* op) const {
    if (rc != MPI_SUCCESS) mpi::detail::check(rc, op, where());
  }


  void refuse_if_broken(const char* op) const {
    if (!state_->broken.empty())
      throw transport_error(op, fmt::format("rank {} of {}"
                                    ": this communicator was abandoned ({}).", rank_, size_, state_->broken),
                            "destroy this transport (and whatever uses it) and restart the job or its failed ranks: MPI cannot cancel "
                            "the collective that timed out.");
  }

  /// A collective begins: refuse on a dead communicator, give it the next number.
  request start(const char* op, dtype type, std::size_t n) {
    refuse_if_broken(op);
    request q;
    q.op = op;
    q.seq = state_->seq++;
    q.type = type;
    q.count = n;
    return q;
  }
  request start_p2p(const char* op, dtype type, std::size_t n, int peer) {
    refuse_if_broken(op);
    request q;
    q.op = op;
    q.peer = peer;
    q.type = type;
    q.count = n;
    return q;
  }

  [[nodiscard]] std::string describe(const request& q) const {
    std::string s = q.seq != no_seq ? fmt::format("collective #{} ", q.seq) : std::string();
    s += fmt::format("{}({} x {}", q.op, q.count, to_string(q.type));
    if (q.seq == no_seq) s += fmt::format("{}{}", q.recv_type != MPI_DATATYPE_NULL ? ", from rank " : ", to rank ", q.peer);
    return s + ")";
  }

  // Runs a blocking collective. Without a timeout: on this thread. With one (and
  // MPI_THREAD_MULTIPLE): on the transport's issuing thread, while this thread sleeps in
  // wait_bounded until it returns. Returns false (nothing done) when MPI lacks
  // MPI_THREAD_MULTIPLE: the caller then starts the non-blocking form and polls it (wait_polled),
  // which is correct but slower.
  template <class Call>
  bool blocking(request& q, const Call& call) {
    // One rank waits for nobody: its collectives cannot stall, so they need no deadline and no
    // hand-off (which costs tens of microseconds when the issuing thread must be woken).
    if (!timed() || size_ == 1) {
      check(call(), q.op);
      return true;
    }
    comm_state& S = *state_;
    if (!S.thread_multiple) return false;
    if (!S.issuer) {
      S.issuer = std::make_unique<gflow::detail::call_thread>();
      S.linger = grace();
    }
    S.issuer->start(call);
    int rc = MPI_SUCCESS;
    // Sleeps until the call returns or the next service time; a collective that completes within
    // one interval never wakes this thread early.
    wait_bounded(q, service_interval(), [&](clock::time_point until) { return S.issuer->wait_until(until, &rc); },
                 [&] { S.issuer->abandon(); });
    check(rc, q.op);
    return true;
  }

  // Polls q with MPI_Test until it completes or the deadline passes (every millisecond it also
  // serves stall queries).
  void wait_polled(request& q, MPI_Status* st) {
    wait_bounded(q, std::chrono::milliseconds(1), [&](clock::time_point) {
      int done = 0;
      check(MPI_Test(&q.r, &done, st), q.op);
      if (!done) std::this_thread::yield();  // as Open MPI's own waits do with more ranks than cores
      return done != 0;
    }, [] {});
  }

  // How often a rank waiting on its issuing thread answers stall queries: well inside the grace
  // period other ranks give it (>= 100 ms), rarely enough to cost nothing.
  [[nodiscard]] std::chrono::milliseconds service_interval() const noexcept {
    return std::clamp<std::chrono::milliseconds>(grace() / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(10));
  }

  // The one wait loop of the timed path: `done(until)` waits at most until `until` (or only
  // checks) and says whether the operation completed. Every `every` it answers stall queries and
  // looks for a notice that a rank gave up on this collective; at the deadline it runs the
  // inspector. `give_up()` runs before either failure (the issuing thread abandons its call).
  template <class Done, class GiveUp>
  void wait_bounded(request& q, clock::duration every, Done done, GiveUp give_up) {
    comm_state& S = *state_;
    const auto t0 = clock::now();
    const auto deadline = t0 + timeout_;
    S.waiting = {q.seq == no_seq ? 2u : 1u, q.seq, op_code(q.op), q.peer};
    struct idle {
      comm_state& s;
      ~idle() { s.waiting = {}; }
    } reset{S};
    auto next_service = t0 + every;
    for (;;) {
      if (done(std::min(deadline, next_service))) return;
      const auto now = clock::now();
      if (now >= next_service) {
        S.serve();
        if (q.seq != no_seq)
          if (const notice* g = S.gave_up_on(q.seq)) {
            give_up();
            fail_after_notice(q, *g, now - t0);
          }
        next_service = now + every;
      }
      if (now >= deadline) {
        give_up();
        stall(q);
      }
    }
  }

  [[noreturn]] void fail_after_notice(const request& q, const notice& g, clock::duration waited) {
    const std::string missing = g.missing.empty() ? std::string("every rank had arrived") : "rank(s) " + rank_list(g.missing) + " had not arrived";
    const std::string what = fmt::format("rank {} of {} waited "
                             "{} ms in {}"
                             " until rank {} gave up on it after its timeout; by then {}.", rank_, size_, std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(), describe(q), g.rank, missing);
    state_->broken = fmt::format("collective #{} {} given up by rank {}", q.seq, q.op, g.rank);
    throw timeout_error(q.op, what, stall_fix());
  }

  static const char* stall_fix() {
    return "find out why the named ranks did not reach this operation (a crash, a different code path, a much slower rank); if they "
           "are only slow, raise the timeout (transport::set_timeout or the constructor's timeout). This transport is unusable now: destroy it "
           "and restart the job.";
  }

  // The stall inspector: ask the ranks this operation waits for where they are, give them a
  // grace period to answer, name those that did not arrive, tell the others, throw.
  [[noreturn]] void stall(const request& q) {
    comm_state& S = *state_;
    const bool collective = q.seq != no_seq;
    std::vector<int> targets;
    if (collective) {
      for (int r = 0; r < size_; ++r)
        if (r != rank_) targets.push_back(r);
    } else {
      targets.push_back(q.peer);
    }
    struct answer {
      std::array<std::uint64_t, 6> v{};
      MPI_Request r = MPI_REQUEST_NULL;
      bool got = false;
    };
    std::vector<answer> ans(targets.size());
    for (std::size_t i = 0; i < targets.size(); ++i) {
      S.post(targets[i], tag_query, {q.seq});
      MPI_Irecv(ans[i].v.data(), 6, MPI_UINT64_T, targets[i], tag_reply, S.ctl, &ans[i].r);
    }
    const auto grace_end = clock::now() + grace();
    std::size_t pending = targets.size();
    while (pending > 0 && clock::now() < grace_end) {
      for (std::size_t i = 0; i < ans.size(); ++i) {
        if (ans[i].got || ans[i].r == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&ans[i].r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          ans[i].r = MPI_REQUEST_NULL;  // unreachable peer: counts as no answer
          --pending;
          continue;
        }
        if (!done) continue;
        if (ans[i].v[0] == q.seq) {
          ans[i].got = true;
          --pending;
        } else {  // a stale answer to an older question: listen again
          MPI_Irecv(ans[i].v.data(), 6, MPI_UINT64_T, targets[i], tag_reply, S.ctl, &ans[i].r);
        }
      }
      S.serve();  // ranks timing out at the same moment ask us too
    }
    for (auto& a : ans)
      if (!a.got && a.r != MPI_REQUEST_NULL) {
        MPI_Cancel(&a.r);
        MPI_Wait(&a.r, MPI_STATUS_IGNORE);
      }
    S.serve();

    std::vector<int> missing;
    std::string details, arrived;  // details: "rank p: why; rank q: why"
    for (std::size_t i = 0; i < targets.size(); ++i) {
      const int p = targets[i];
      const auto& v = ans[i].v;
      const notice* g = nullptr;
      if (collective)
        for (const auto& n : S.notices)
          if (n.rank == p && n.seq == q.seq) g = &n;
      if (collective && ((ans[i].got && v[1] > q.seq) || g != nullptr)) {
        arrived += fmt::format("{}{}", (arrived.empty() ? "" : ", "), p);
        continue;
      }
      missing.push_back(p);
      details += fmt::format("{}{}: ", (details.empty() ? "rank " : "; rank "), p);
      if (!ans[i].got) {
        details += fmt::format("no answer within the {} ms grace period: computing outside gflow, stuck, or exited", grace().count());
        continue;
      }
      details += fmt::format("has started {} collective(s) and is waiting in ", v[1]);
      if (v[2] == 1) details += fmt::format("collective #{} {}", v[3], op_name(v[4]));
      else if (v[2] == 2) details += fmt::format("{} with rank {}", op_name(v[4]), static_cast<std::int64_t>(v[5]));
      else details += "nothing";
    }
    std::string what = fmt::format("rank {} of {} waited {}"
                       " ms for {}; ", rank_, size_, timeout_.count(), describe(q));
    if (missing.empty()) {
      what += "every rank arrived (" + arrived + "), but it did not complete (a very slow network or a huge message?).";
    } else {
      what += std::string(collective ? "rank(s) " : "the peer, rank ") + rank_list(missing) + " did not arrive (" + details + ").";
      if (!arrived.empty()) what += " Arrived: rank(s) " + arrived + ".";
    }
    if (collective) {
      std::vector<std::uint64_t> note{q.seq, missing.size()};
      for (int m : missing) note.push_back(static_cast<std::uint64_t>(m));
      for (int p : targets) S.post(p, tag_notice, note);
    }
    S.broken = fmt::format("{}{} timed out after "
               "{} ms", (collective ? fmt::format("collective #{} ", q.seq) : std::string()), q.op, timeout_.count());
    throw timeout_error(q.op, what, stall_fix());
  }

  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<comm_state> state_;  // shared with copies: sequence numbers, control comm
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace gflow::mpi::detail
