#pragma once
// In-process transport: P ranks as P threads of one process, sharing memory.
// Used by the tests (many ranks cheaply, deterministic) and for several simulated ranks in
// one process.
//
// How a collective runs: each rank posts its operation into the group's slot for its next
// sequence number (collectives are numbered per rank, so the n-th collective of every rank
// meets in slot n). The last rank to arrive checks that every rank posted the same operation
// (kind, element type, count, op, root) and executes it for everyone; waiters are woken.
// Reductions add rank 0, 1, ..., P-1 in that order, so every rank gets the same bits.
// A mismatch raises gflow::mismatch_error on every rank; a rank that never arrives raises
// gflow::timeout_error naming the missing ranks once the timeout passes. Point-to-point sends
// are buffered (send returns at once); recv blocks until the message is there.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../detail/kernels/cast.hpp"
#include "inproc/group.hpp"
#include "transport.hpp"

namespace gflow::inproc {

class transport : public transport_base<host_memory> {
 public:
  /// A pending operation. Collectives carry their slot; a receive carries its destination.
  struct request {
    enum class what : std::uint8_t { none, collective, recv } type = what::none;
    std::uint64_t seq = 0;
    void* buf = nullptr;
    std::size_t count = 0;
    dtype elem{};
    int peer = -1;
  };

  transport(std::shared_ptr<detail::group> g, int rank) : g_(std::move(g)), rank_(rank) {}

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return g_->size; }
  [[nodiscard]] const std::string& label() const { return g_->label; }

  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    return post({detail::kind::all_reduce, dtype_of_v<T>, n, op, 0}, buf, nullptr, &detail::exec_all_reduce<T>);
  }
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    return post({detail::kind::all_gather, dtype_of_v<T>, n, reduce_op::sum, 0}, recv, send, &detail::exec_all_gather<T>);
  }
  template <wire_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    return post({detail::kind::broadcast, dtype_of_v<T>, n, reduce_op::sum, root}, buf, nullptr, &detail::exec_broadcast<T>);
  }
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op op, int root) {
    check_peer(root, "root");
    return post({detail::kind::reduce, dtype_of_v<T>, n, op, root}, buf, nullptr, &detail::exec_reduce<T>);
  }

  template <wire_element T> void all_reduce(T* buf, std::size_t n, reduce_op op) { auto r = iall_reduce(buf, n, op); wait(r); }
  template <wire_element T> void all_gather(const T* s, T* r, std::size_t n) { auto q = iall_gather(s, r, n); wait(q); }
  template <wire_element T> void broadcast(T* buf, std::size_t n, int root) { auto r = ibroadcast(buf, n, root); wait(r); }
  template <wire_element T> void reduce(T* buf, std::size_t n, reduce_op op, int root) { auto r = ireduce(buf, n, op, root); wait(r); }
  /// Block q of send (n elements) goes to rank q; recv's block q comes from rank q.
  template <wire_element T>
  void all_to_all(const T* send, T* recv, std::size_t n) {
    auto r = post({detail::kind::all_to_all, dtype_of_v<T>, n, reduce_op::sum, 0}, recv, send, &detail::exec_all_to_all<T>);
    wait(r);
  }
  /// Packed blocks: send_counts[q] elements to rank q, recv_counts[q] from rank q (each pair must
  /// agree, else mismatch_error on every rank).
  template <wire_element T>
  void all_to_allv(const T* send, const std::size_t* send_counts, T* recv, const std::size_t* recv_counts) {
    auto r = post({detail::kind::all_to_allv, dtype_of_v<T>, 0, reduce_op::sum, 0}, recv, send, &detail::exec_all_to_allv<T>, send_counts, recv_counts);
    wait(r);
  }
  /// recv holds counts[0] + ... + counts[P-1] elements, rank q's n = counts[q] in rank order.
  template <wire_element T>
  void all_gatherv(const T* send, std::size_t n, T* recv, const std::size_t* counts) {
    auto r = post({detail::kind::all_gatherv, dtype_of_v<T>, 0, reduce_op::sum, 0}, recv, send, &detail::exec_all_gatherv<T>, &n, counts);
    wait(r);
  }
  /// send holds counts[0] + ... + counts[P-1] elements in P packed blocks; recv gets block rank()
  /// reduced over every rank, in rank order (bitwise what all_reduce gives those elements).
  /// Every rank must pass the same counts (else mismatch_error on every rank).
  template <wire_element T>
  request ireduce_scatter(const T* send, T* recv, const std::size_t* counts, reduce_op op) {
    return post({detail::kind::reduce_scatter, dtype_of_v<T>, total(counts), op, 0}, recv, send, &detail::exec_reduce_scatter<T>, nullptr, counts);
  }
  template <wire_element T>
  void reduce_scatter(const T* send, T* recv, const std::size_t* counts, reduce_op op) {
    auto r = ireduce_scatter(send, recv, counts, op);
    wait(r);
  }
  /// buf holds P packed blocks (counts, the same on every rank); block q comes from rank q's buf.
  template <wire_element T>
  void all_gatherv_in_place(T* buf, const std::size_t* counts) {
    auto r = post({detail::kind::all_gatherv_in_place, dtype_of_v<T>, total(counts), reduce_op::sum, 0}, buf, nullptr,
                  &detail::exec_all_gatherv_in_place<T>, nullptr, counts);
    wait(r);
  }
  void barrier() {
    auto r = post({detail::kind::barrier, dtype::u8, 0, reduce_op::sum, 0}, nullptr, nullptr, &detail::exec_barrier);
    wait(r);
  }

  template <wire_element T>
  request isend(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    detail::message msg{dtype_of_v<T>, n, std::vector<unsigned char>(n * sizeof(T))};
    if (n) std::memcpy(msg.data.data(), buf, n * sizeof(T));
    {
      std::lock_guard lk(g_->m);
      g_->mail[{rank_, peer}].push_back(std::move(msg));
    }
    g_->cv.notify_all();
    return {};
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    request r;
    r.type = request::what::recv;
    r.buf = buf;
    r.count = n;
    r.elem = dtype_of_v<T>;
    r.peer = peer;
    return r;
  }
  template <wire_element T> void send(const T* buf, std::size_t n, int peer) { (void)isend(buf, n, peer); }
  template <wire_element T> void recv(T* buf, std::size_t n, int peer) { auto r = irecv(buf, n, peer); wait(r); }

  void wait(request& r) {
    if (r.type == request::what::collective) wait_collective(r);
    else if (r.type == request::what::recv) wait_recv(r);
    r.type = request::what::none;
  }

  /// Collective: every rank of this group calls split; ranks with the same color form a group,
  /// ordered by (key, rank).
  transport split(int color, int key) {
    detail::split_io io{color, key, nullptr, -1};
    auto r = post({detail::kind::split, dtype::u8, 0, reduce_op::sum, 0}, &io, nullptr, &detail::exec_split);
    wait(r);
    return transport(io.out, io.out_rank);
  }

 private:
  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size(), what); }
  [[nodiscard]] std::size_t total(const std::size_t* counts) const {
    std::size_t n = 0;
    for (int q = 0; q < size(); ++q) n += counts[q];
    return n;
  }

  request post(detail::signature sig, void* buf, const void* cbuf, void (*exec)(detail::slot&, detail::group&),
               const std::size_t* scounts = nullptr, const std::size_t* rcounts = nullptr) {
    const std::uint64_t seq = next_seq_++;
    bool run = false;
    bool failed_now = false;
    detail::slot* s = nullptr;
    {
      std::lock_guard lk(g_->m);
      s = &g_->slots[seq];
      if (s->arrived == 0) {
        s->sig = sig;
        s->exec = exec;
        s->ptr.assign(g_->size, nullptr);
        s->cptr.assign(g_->size, nullptr);
        s->present.assign(g_->size, 0);
        s->scounts.assign(g_->size, nullptr);
        s->rcounts.assign(g_->size, nullptr);
        s->sigs.assign(g_->size, {});
      } else if (!(s->sig == sig) && s->error.empty()) {
        s->error = fmt::format("collective #{} differs across ranks", seq);
      }
      s->sigs[rank_] = sig;
      s->ptr[rank_] = buf;
      s->cptr[rank_] = cbuf;
      s->scounts[rank_] = scounts;
      s->rcounts[rank_] = rcounts;
      s->present[rank_] = 1;
      run = (++s->arrived == g_->size);
      if (run && s->abandoned) {  // a rank already gave up on this collective: fail it for everyone
        s->done = true;
        run = false;
        failed_now = true;
      }
      if (run) s->executing = true;
    }
    if (failed_now) g_->cv.notify_all();
    if (run) {
      if (s->error.empty()) s->exec(*s, *g_);
      {
        std::lock_guard lk(g_->m);
        s->done = true;
      }
      g_->cv.notify_all();
    }
    request r;
    r.type = request::what::collective;
    r.seq = seq;
    return r;
  }

  void wait_collective(request& r) {
    std::unique_lock lk(g_->m);
    auto it = g_->slots.find(r.seq);
    if (it == g_->slots.end()) throw usage_error("wait", "the request was already completed.", "wait on each request once.");
    detail::slot& s = it->second;
    const auto deadline = std::chrono::steady_clock::now() + g_->timeout;
    if (!g_->cv.wait_until(lk, deadline, [&] { return s.done; }) && s.executing) {
      g_->cv.wait(lk, [&] { return s.done; });  // everyone arrived and it is running: it will end
    }
    if (!s.done) {
      // Give up, and make sure nobody ever runs this collective on our (soon gone) buffer.
      s.abandoned = true;
      if (s.error.empty()) s.error = fmt::format("rank {} gave up on collective #{} after a timeout", rank_, r.seq);
      std::string missing;
      for (int q = 0; q < g_->size; ++q)
        if (!s.present[q]) missing += fmt::format("{}{}", (missing.empty() ? "" : ", "), q);
      const char* op = detail::name(s.sig.k);
      const std::string what = fmt::format("rank {} of group '{}' waited {}"
                               " ms for collective #{} {}; rank(s) {} did not arrive.", rank_, g_->label, g_->timeout.count(), r.seq, s.sig.str(), missing);
      if (++s.waited == g_->size) g_->slots.erase(it);
      throw timeout_error(op, what, "make every rank issue the same collectives in the same order, or raise the timeout.");
    }
    // copy what the error needs: the last waiter erases the slot
    const std::string err = s.error;
    const bool abandoned = s.abandoned;
    const char* op = detail::name(s.sig.k);
    std::string detail_msg;
    if (!err.empty())
      for (int q = 0; q < g_->size; ++q) detail_msg += fmt::format(" rank {}: {};", q, s.sigs[q].str());
    if (++s.waited == g_->size) g_->slots.erase(it);
    if (abandoned)
      throw timeout_error(op, err + " in group '" + g_->label + "'; this collective was not executed.",
                          "make every rank issue the same collectives in the same order, or raise the timeout.");
    if (!err.empty())
      throw mismatch_error(op, err + " in group '" + g_->label + "':" + detail_msg,
                           "make every rank describe the same layout and policies and issue the same collectives.");
  }

  void wait_recv(request& r) {
    std::unique_lock lk(g_->m);
    auto& q = g_->mail[{r.peer, rank_}];
    const auto deadline = std::chrono::steady_clock::now() + g_->timeout;
    if (!g_->cv.wait_until(lk, deadline, [&] { return !q.empty(); }))
      throw timeout_error("recv", fmt::format("rank {} waited {}"
                                      " ms for a message from rank {} that was never sent.", rank_, g_->timeout.count(), r.peer),
                          "pair every recv with a send on the peer, or raise the timeout.");
    detail::message msg = std::move(q.front());
    q.pop_front();
    lk.unlock();
    if (msg.type != r.elem || msg.count != r.count)
      throw mismatch_error("recv", fmt::format("rank {} expected {} x {}"
                                       " from rank {} but got {} x "
                                       "{}.", rank_, r.count, to_string(r.elem), r.peer, msg.count, to_string(msg.type)),
                           "make send and recv agree on count and element type.");
    if (r.count) std::memcpy(r.buf, msg.data.data(), msg.data.size());
  }

  std::shared_ptr<detail::group> g_;
  int rank_;
  std::uint64_t next_seq_ = 0;
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport> && gflow::sharding_transport<transport>);

/// Runs fn(transport&) on `ranks` threads, one rank each, and rethrows the first exception
/// (lowest rank) after every thread has ended.
template <class Fn>
void run(int ranks, Fn&& fn, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  if (ranks <= 0) throw invalid_argument("ranks", "must be at least 1.", "pass a positive number of ranks.");
  auto g = std::make_shared<detail::group>(ranks, timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        transport t(g, r);
        fn(t);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace gflow::inproc
