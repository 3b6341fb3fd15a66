#pragma once
// gflow::timeline: an opt-in recorder of what an exchanger does, written as Chrome trace-event
// JSON (opens in Perfetto and chrome://tracing; pid = rank, one file for every rank).
//
//   gflow::timeline tl;                 // per rank; capacity is preallocated
//   ex.set_timeline(&tl);               // off again with set_timeline(nullptr); off by default
//   tl.start(transport);                // barrier, then the common time origin
//   ... iterations ...
//   tl.write_chrome_trace(transport, "trace.json");   // collective: rank 0 writes every rank's events
//
// Recorded per rank: ready(i) (instant), each bucket's launch (instant, caller thread) and its
// exchange (span, issuing thread) with the stages inside it (cast / collective / widen and
// average; for the sparsifiers their selection), finish() (span) and the iteration boundaries.
// Cost when off: the exchanger holds a null pointer and each hook is one predictable branch.
// Cost when on: a steady_clock read and a store into a preallocated buffer (an atomic index, so
// issuing threads record without a lock). When the buffer is full, events are counted as dropped
// instead of allocating during an iteration.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "error.hpp"

namespace gflow {

/// What one timeline event is.
enum class trace_kind : std::uint8_t {
  ready,       // instant: tensor `id` became ready
  launch,      // instant: bucket `id` handed to the Overlap runner (caller thread)
  bucket,      // span: bucket `id` exchanged (the thread that ran it)
  cast,        // span: divide and cast to the wire type
  select,      // span: a sparsifier's selection (TopK / GTopK / CSC)
  collective,  // span: the transport's collective(s)
  widen,       // span: cast back and average (or average alone on an fp32 wire)
  finish,      // span: finish(), from its call to its return
  iteration,   // span: an iteration, from its first ready() to finish()'s return
};

[[nodiscard]] constexpr const char* trace_kind_name(trace_kind k) noexcept {
  switch (k) {
    case trace_kind::ready: return "ready";
    case trace_kind::launch: return "launch";
    case trace_kind::bucket: return "bucket";
    case trace_kind::cast: return "cast";
    case trace_kind::select: return "select";
    case trace_kind::collective: return "collective";
    case trace_kind::widen: return "widen+average";
    case trace_kind::finish: return "finish";
    case trace_kind::iteration: return "iteration";
  }
  return "?";
}

class timeline {
 public:
  using clock = std::chrono::steady_clock;

  struct event {
    std::int64_t begin_ns = 0;  // steady_clock, absolute
    std::int64_t end_ns = 0;    // == begin_ns for instants
    std::uint64_t iteration = 0;
    std::uint64_t bytes = 0;    // buckets and stages: wire bytes of the bucket
    std::uint32_t id = 0;       // tensor or bucket index
    std::uint32_t thread = 0;   // 0: the thread that called start(); others: a hash of the thread id
    trace_kind kind = trace_kind::ready;
  };

  /// `capacity` events are allocated here, never during an iteration.
  explicit timeline(std::size_t capacity = std::size_t{1} << 18) : events_(capacity) {
    if (capacity == 0)
      throw invalid_argument("capacity", "a timeline needs room for at least one event (got 0).",
                             "pass the number of events to keep, e.g. 1 << 18 (about 12 MiB).");
    origin_ns_ = now_ns();
    main_ = std::this_thread::get_id();
  }
  timeline(const timeline&) = delete;
  timeline& operator=(const timeline&) = delete;

  [[nodiscard]] static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
  }

  /// Sets the common time origin: a barrier over the transport, then now. Collective. Events
  /// recorded before are kept (their times come out negative).
  template <class T>
  void start(T& t) {
    t.barrier();
    origin_ns_ = now_ns();
    main_ = std::this_thread::get_id();
  }

  void instant(trace_kind k, std::uint32_t id, std::uint64_t iteration, std::uint64_t bytes = 0) noexcept {
    const std::int64_t t = now_ns();
    record({t, t, iteration, bytes, id, thread_tag(), k});
  }
  void span(trace_kind k, std::uint32_t id, std::uint64_t iteration, std::int64_t begin_ns, std::int64_t end_ns, std::uint64_t bytes = 0) noexcept {
    record({begin_ns, end_ns, iteration, bytes, id, thread_tag(), k});
  }

  /// Events recorded so far (between iterations only: issuing threads may be recording).
  [[nodiscard]] std::size_t size() const noexcept { return std::min(next_.load(std::memory_order_acquire), events_.size()); }
  [[nodiscard]] const event& operator[](std::size_t i) const noexcept { return events_[i]; }
  [[nodiscard]] std::size_t capacity() const noexcept { return events_.size(); }
  [[nodiscard]] std::size_t dropped() const noexcept {
    const std::size_t n = next_.load(std::memory_order_acquire);
    return n > events_.size() ? n - events_.size() : 0;
  }
  [[nodiscard]] std::int64_t origin_ns() const noexcept { return origin_ns_; }
  /// Forgets every event (between iterations only).
  void clear() noexcept { next_.store(0, std::memory_order_release); }

  /// This rank's events as Chrome trace-event objects, comma-separated (no brackets).
  [[nodiscard]] std::string json_events(int rank) const {
    std::string s;
    char buf[320];
    auto add = [&](int n) { s.append(buf, static_cast<std::size_t>(std::max(0, std::min<int>(n, sizeof buf - 1)))); };
    auto sep = [&] {
      if (!s.empty()) s += ",\n";
    };
    sep();
    add(std::snprintf(buf, sizeof buf, R"j({"name":"process_name","ph":"M","pid":%d,"tid":0,"args":{"name":"rank %d"}})j", rank, rank));
    sep();
    add(std::snprintf(buf, sizeof buf, R"j({"name":"thread_name","ph":"M","pid":%d,"tid":0,"args":{"name":"caller (backward, ready, finish)"}})j", rank));
    std::vector<std::uint32_t> named{0};
    const std::size_t n = size();
    for (std::size_t i = 0; i < n; ++i) {
      const event& e = events_[i];
      if (std::find(named.begin(), named.end(), e.thread) == named.end()) {
        named.push_back(e.thread);
        sep();
        add(std::snprintf(buf, sizeof buf, R"j({"name":"thread_name","ph":"M","pid":%d,"tid":%u,"args":{"name":"issuing thread %zu"}})j", rank,
                          e.thread, named.size() - 1));
      }
      const double ts = static_cast<double>(e.begin_ns - origin_ns_) / 1e3;  // microseconds
      const char* name = trace_kind_name(e.kind);
      sep();
      if (e.kind == trace_kind::ready || e.kind == trace_kind::launch) {
        add(std::snprintf(buf, sizeof buf, R"j({"name":"%s %u","cat":"%s","ph":"i","s":"t","ts":%.3f,"pid":%d,"tid":%u,"args":{"iteration":%llu,"bytes":%llu}})j",
                          name, e.id, name, ts, rank, e.thread, static_cast<unsigned long long>(e.iteration), static_cast<unsigned long long>(e.bytes)));
      } else {
        const double dur = static_cast<double>(e.end_ns - e.begin_ns) / 1e3;
        char label[64];
        if (e.kind == trace_kind::bucket) std::snprintf(label, sizeof label, "%s %u", name, e.id);
        else if (e.kind == trace_kind::finish || e.kind == trace_kind::iteration)
          std::snprintf(label, sizeof label, "%s %llu", name, static_cast<unsigned long long>(e.iteration));
        else std::snprintf(label, sizeof label, "%s", name);  // a stage: nested in its bucket's span
        add(std::snprintf(buf, sizeof buf, R"j({"name":"%s","cat":"%s","ph":"X","ts":%.3f,"dur":%.3f,"pid":%d,"tid":%u,"args":{"iteration":%llu,"bytes":%llu}})j",
                          label, name, ts, dur, rank, e.thread, static_cast<unsigned long long>(e.iteration), static_cast<unsigned long long>(e.bytes)));
      }
    }
    return s;
  }

  /// Collective: gathers every rank's events on rank 0 (transport all_gather of the sizes, then
  /// point-to-point of the serialized bytes), which writes `path` as {"traceEvents": [...]}.
  /// Between iterations. Throws invalid_argument on rank 0 when the file cannot be written.
  template <class T>
  void write_chrome_trace(T& t, const std::string& path) const {
    const std::string mine = json_events(t.rank());
    const int P = t.size();
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(P));
    const std::uint64_t my_size = mine.size();
    t.all_gather(&my_size, sizes.data(), 1);
    if (t.rank() != 0) {
      if (!mine.empty()) t.send(reinterpret_cast<const std::uint8_t*>(mine.data()), mine.size(), 0);
      return;
    }
    std::ofstream out(path, std::ios::binary);
    std::vector<std::uint8_t> buf;
    out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"gflow::timeline\",\"ranks\":" << P << "},\"traceEvents\":[\n";
    bool first = true;
    for (int r = 0; r < P; ++r) {
      const std::size_t n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]);
      if (n == 0) continue;
      if (!first) out << ",\n";
      first = false;
      if (r == 0) {
        out << mine;
      } else {
        buf.resize(n);
        t.recv(buf.data(), n, r);
        out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n));
      }
    }
    out << "\n]}\n";
    out.flush();
    if (!out)
      throw invalid_argument("path", "could not write the trace to '" + path + "'.", "pass a writable file path (its directory must exist).");
  }

 private:
  void record(const event& e) noexcept {
    const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i < events_.size()) events_[i] = e;
  }
  [[nodiscard]] std::uint32_t thread_tag() const noexcept {
    const auto id = std::this_thread::get_id();
    if (id == main_) return 0;
    return static_cast<std::uint32_t>(std::hash<std::thread::id>{}(id) % 1000000u) + 1u;
  }

  std::vector<event> events_;
  std::atomic<std::size_t> next_{0};
  std::int64_t origin_ns_ = 0;
  std::thread::id main_;
};

namespace detail {
/// A stage span recorded only when a timeline is attached: `trace` is the exchanger's pointer.
struct stage_clock {
  timeline* tl;
  std::int64_t t0;
  explicit stage_clock(timeline* t) noexcept : tl(t), t0(t ? timeline::now_ns() : 0) {}
  void lap(trace_kind k, std::uint32_t id, std::uint64_t it, std::uint64_t bytes) noexcept {
    if (!tl) return;
    const std::int64_t t1 = timeline::now_ns();
    tl->span(k, id, it, t0, t1, bytes);
    t0 = t1;
  }
};
}  // namespace detail

}  // namespace gflow
