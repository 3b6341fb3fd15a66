#pragma once
// Recording mock transport: one process plays one rank of a group of `size` ranks in which
// every rank holds the same data. Every call is logged (operation, element count, element type,
// bytes, peer/root, group, async) so policy tests can assert exactly what went on the wire.
// Data semantics, chosen so results are predictable: all_reduce/reduce with sum multiply by
// size (max/min leave data as is); all_gather replicates the local block; broadcast leaves the
// buffer; recv fills from a queue the test provides (zeros when empty); send only records.
// split(color, key) keeps the size and rank unless the test installs a split rule
// (log::split_rule) that says which sub-group the played rank lands in.
// Control traffic (control_all_gather / control_broadcast: the exchanger's cross-rank consistency
// check at construction) is logged apart, in log::control, so records holds the gradient traffic.
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../detail/kernels/cast.hpp"
#include "transport.hpp"

namespace gflow::mock {

enum class op : std::uint8_t { all_reduce, all_gather, broadcast, reduce, send, recv, barrier, split, wait, all_to_all, all_to_allv, all_gatherv };

inline const char* to_string(op o) {
  switch (o) {
    case op::all_reduce: return "all_reduce";
    case op::all_gather: return "all_gather";
    case op::broadcast: return "broadcast";
    case op::reduce: return "reduce";
    case op::send: return "send";
    case op::recv: return "recv";
    case op::barrier: return "barrier";
    case op::split: return "split";
    case op::wait: return "wait";
    case op::all_to_all: return "all_to_all";
    case op::all_to_allv: return "all_to_allv";
    case op::all_gatherv: return "all_gatherv";
  }
  return "?";
}

struct record {
  mock::op kind;
  std::size_t count = 0;   // elements per rank
  dtype type = dtype::u8;
  std::size_t bytes = 0;   // count * element size (what this rank puts on the wire)
  int peer = -1;           // root for broadcast/reduce, peer for send/recv, color for split
  std::string group;       // "world", "world/0", ...
  bool async = false;
  reduce_op reduction = reduce_op::sum;
};

/// What a split rule is asked: the group being split, the played rank's place in it, and the
/// arguments of split(color, key).
struct split_query {
  std::string group;  // "world", "world/0", ...
  int size = 1;
  int rank = 0;
  int color = 0;
  int key = 0;
};
/// Its answer: the size of the played rank's sub-group and the played rank's rank there.
struct split_result {
  int size = 1;
  int rank = 0;
};

struct log {
  std::vector<record> records;
  std::vector<record> control;  // control messages (consistency check), not gradient traffic
  std::deque<std::vector<unsigned char>> inbox;  // payloads handed to recv, in order
  /// Optional: how split() sizes the sub-group (the mock cannot see the other ranks' colours).
  /// Empty: the sub-group keeps the parent's size and rank. Shared by every transport on this log.
  std::function<split_result(const split_query&)> split_rule;
  /// Records of one kind, in order.
  [[nodiscard]] std::vector<record> of(mock::op k) const {
    std::vector<record> out;
    for (const auto& r : records)
      if (r.kind == k) out.push_back(r);
    return out;
  }
  void clear() {
    records.clear();
    control.clear();
  }
  /// Appends under a lock: the exchanger may call the transport (and the sub-transports split
  /// from it, which share this log) from several issuing threads at once (Overlap<Concurrent<N>>).
  void append(std::vector<record>& to, record r) {
    std::lock_guard lk(*guard);
    to.push_back(std::move(r));
  }
  std::shared_ptr<std::mutex> guard = std::make_shared<std::mutex>();  // shared by copies of the log
};

class transport : public transport_base<host_memory> {
 public:
  struct request {
    bool active = false;
  };

  explicit transport(int size = 1, int rank = 0, std::shared_ptr<mock::log> l = std::make_shared<mock::log>(), std::string group = "world")
      : size_(size), rank_(rank), log_(std::move(l)), group_(std::move(group)) {
    if (size <= 0) throw invalid_argument("size", "a mock group needs at least one rank.", "pass size >= 1.");
    if (rank < 0 || rank >= size) throw invalid_argument("rank", "rank outside [0, size).", "pass 0 <= rank < size.");
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] mock::log& calls() const { return *log_; }
  [[nodiscard]] const std::shared_ptr<mock::log>& shared_log() const { return log_; }

  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op o) { note<T>(op::all_reduce, n, -1, true, o); scale(buf, n, o); return {true}; }
  template <wire_element T>
  request iall_gather(const T* s, T* r, std::size_t n) {
    note<T>(op::all_gather, n, -1, true);
    for (int q = 0; q < size_; ++q) if (n) std::memcpy(r + static_cast<std::size_t>(q) * n, s, n * sizeof(T));
    return {true};
  }
  template <wire_element T>
  request ibroadcast(T*, std::size_t n, int root) { note<T>(op::broadcast, n, root, true); return {true}; }
  template <wire_element T>
  request isend(const T*, std::size_t n, int peer) { note<T>(op::send, n, peer, true); return {true}; }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) { note<T>(op::recv, n, peer, true); fill(buf, n); return {true}; }

  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op o) { note<T>(op::all_reduce, n, -1, false, o); scale(buf, n, o); }
  template <wire_element T>
  void all_gather(const T* s, T* r, std::size_t n) {
    note<T>(op::all_gather, n, -1, false);
    for (int q = 0; q < size_; ++q) if (n) std::memcpy(r + static_cast<std::size_t>(q) * n, s, n * sizeof(T));
  }
  template <wire_element T>
  void broadcast(T*, std::size_t n, int root) { note<T>(op::broadcast, n, root, false); }
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op o, int root) { note<T>(op::reduce, n, root, false, o); if (rank_ == root) scale(buf, n, o); }
  template <wire_element T>
  void send(const T*, std::size_t n, int peer) { note<T>(op::send, n, peer, false); }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) { note<T>(op::recv, n, peer, false); fill(buf, n); }
  // Every rank holds the same data, so what rank q sends to the played rank is the played rank's
  // own block: all_to_all(v) copies send's block rank() into each recv block; all_gatherv
  // replicates send. Logged count: elements this rank sends (all_to_allv: the sum of send_counts).
  template <wire_element T>
  void all_to_all(const T* s, T* r, std::size_t n) {
    note<T>(op::all_to_all, n * static_cast<std::size_t>(size_), -1, false);
    for (int q = 0; q < size_; ++q) if (n) std::memcpy(r + static_cast<std::size_t>(q) * n, s + static_cast<std::size_t>(rank_) * n, n * sizeof(T));
  }
  template <wire_element T>
  void all_to_allv(const T* s, const std::size_t* sc, T* r, const std::size_t* rc) {
    std::size_t total = 0, mine = 0;
    for (int q = 0; q < size_; ++q) {
      if (q < rank_) mine += sc[q];
      total += sc[q];
    }
    note<T>(op::all_to_allv, total, -1, false);
    std::size_t at = 0;
    for (int q = 0; q < size_; ++q) {
      if (rc[q] != sc[rank_])
        throw mismatch_error("all_to_allv",
                             fmt::format("mock rank {} expects {} elements from rank {}, which (holding the same data) sends {}.", rank_, rc[q], q, sc[rank_]),
                             "pass receive counts that match what the peers send.");
      if (rc[q]) std::memcpy(r + at, s + mine, rc[q] * sizeof(T));
      at += rc[q];
    }
  }
  template <wire_element T>
  void all_gatherv(const T* s, std::size_t n, T* r, const std::size_t* counts) {
    note<T>(op::all_gatherv, n, -1, false);
    std::size_t at = 0;
    for (int q = 0; q < size_; ++q) {
      if (counts[q] != n)
        throw mismatch_error("all_gatherv",
                             fmt::format("mock rank {} expects {} elements from rank {}, which (holding the same data) contributes {}.", rank_, counts[q], q, n),
                             "pass counts that match what the peers contribute.");
      if (n) std::memcpy(r + at, s, n * sizeof(T));
      at += n;
    }
  }
  /// Host-buffer control messages: same data semantics as all_gather / broadcast, logged in log::control.
  template <wire_element T>
  void control_all_gather(const T* s, T* r, std::size_t n) {
    log_->append(log_->control, {op::all_gather, n, dtype_of_v<T>, n * sizeof(T), -1, group_, false});
    for (int q = 0; q < size_; ++q) if (n) std::memcpy(r + static_cast<std::size_t>(q) * n, s, n * sizeof(T));
  }
  template <wire_element T>
  void control_broadcast(T*, std::size_t n, int root) {
    gflow::detail::check_peer_rank(root, size_, "root");
    log_->append(log_->control, {op::broadcast, n, dtype_of_v<T>, n * sizeof(T), root, group_, false});
  }
  void barrier() { log_->append(log_->records, {op::barrier, 0, dtype::u8, 0, -1, group_, false}); }
  void wait(request& r) {
    if (!r.active) return;
    r.active = false;
    log_->append(log_->records, {op::wait, 0, dtype::u8, 0, -1, group_, false});
  }

  /// Sub-group "<group>/<color>". Which ranks share the colour is unknowable to one mock rank,
  /// so the size and rank come from the log's split_rule when the test installed one (an
  /// impossible answer raises invalid_argument), else they stay the parent's. The split itself
  /// is recorded (peer = color).
  transport split(int color, int key) {
    log_->append(log_->records, {op::split, 0, dtype::u8, 0, color, group_, false});
    std::string label = fmt::format("{}/{}", group_, color);
    if (log_->split_rule) {
      const split_result r = log_->split_rule(split_query{group_, size_, rank_, color, key});
      return transport(r.size, r.rank, log_, std::move(label));
    }
    return transport(size_, rank_, log_, std::move(label));
  }

 private:
  template <class T>
  void note(op k, std::size_t n, int peer, bool async, reduce_op o = reduce_op::sum) {
    log_->append(log_->records, {k, n, dtype_of_v<T>, n * sizeof(T), peer, group_, async, o});
  }
  template <class T>
  void scale(T* buf, std::size_t n, reduce_op o) {
    if (o != reduce_op::sum) return;
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
        buf[i] = gflow::detail::kernels::wire_cast<T>(gflow::detail::kernels::to_float(buf[i]) * static_cast<float>(size_));
      else
        buf[i] = static_cast<T>(buf[i] * static_cast<T>(size_));
    }
  }
  template <class T>
  void fill(T* buf, std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    std::vector<unsigned char> payload;
    {
      std::lock_guard lk(*log_->guard);
      if (log_->inbox.empty()) {
        if (bytes) std::memset(buf, 0, bytes);
        return;
      }
      payload = std::move(log_->inbox.front());
      log_->inbox.pop_front();
    }
    if (payload.size() != bytes)
      throw mismatch_error("recv", fmt::format("mock inbox payload has {} bytes, recv expects {}.", payload.size(), bytes),
                           "queue a payload of the size the test's recv asks for.");
    if (bytes) std::memcpy(buf, payload.data(), bytes);
  }

  int size_;
  int rank_;
  std::shared_ptr<mock::log> log_;
  std::string group_;
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport>);

}  // namespace gflow::mock
