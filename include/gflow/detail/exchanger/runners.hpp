#pragma once
// The issuing side of the Overlap policies (policies/overlap.hpp says what each one means).
// A runner receives post(b) from ready() for every bucket, in pool order, once per iteration,
// and drain() from finish(), which returns once every posted bucket is exchanged or rethrows the
// first error of an issuing thread.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "../engines/concepts.hpp"
#include "../../policies/overlap.hpp"
#include "../support/issuing_thread.hpp"
#include "../../timeline.hpp"

namespace gflow::detail {

// Runs f (bucket b's exchange) and, when a timeline is attached, records its span.
template <class Ctx, class F>
void traced_bucket(const Ctx& cx, std::size_t b, F&& f) {
  timeline* tl = cx.tracer();
  if (!tl) [[likely]] {
    f();
    return;
  }
  const std::int64_t t0 = timeline::now_ns();
  f();
  tl->span(trace_kind::bucket, static_cast<std::uint32_t>(b), *cx.iteration, t0, timeline::now_ns(),
           (*cx.buckets)[b].count * sizeof(typename Ctx::wire_type));
}

template <class Strategy, class Ctx, class Eng>
class overlap_runner;

// ---- None: on the caller's thread ---------------------------------------------------------------
template <class Ctx, class Eng>
class overlap_runner<None, Ctx, Eng> {
 public:
  overlap_runner(Ctx& cx, Eng& e) : cx_(&cx), e_(&e) {}
  void post(std::size_t b) { traced_bucket(*cx_, b, [&] { e_->exchange(b); }); }
  void drain() {}
  void replan() {}
  std::size_t take_nonfinite() { return 0; }

 private:
  Ctx* cx_;
  Eng* e_;
};

// ---- Funneled: one issuing thread, pool order -----------------------------------------------------
template <class Ctx, class Eng>
class overlap_runner<Funneled, Ctx, Eng> {
 public:
  overlap_runner(Ctx& cx, Eng& e) : cx_(&cx), e_(&e), th_([this](std::size_t b, std::size_t) {
        traced_bucket(*cx_, b, [&] { e_->exchange(b); });
        return true;
      }) {}
  void post(std::size_t) { th_.post(); }
  void drain() { th_.drain(); }
  void replan() {}
  std::size_t take_nonfinite() { return 0; }

 private:
  Ctx* cx_;
  Eng* e_;
  issuing_thread th_;
};

// ---- Concurrent<N>: N communicators, bucket b on communicator b mod N ----------------------------
template <int N, class Ctx, class Eng>
class overlap_runner<Concurrent<N>, Ctx, Eng> {
  using T = typename Ctx::transport_type;
  using Topo = typename Ctx::topology_engine;
  using Kern = typename Ctx::backend::context;

  struct lane {
    lane(T& world, const Ctx& base, int k, std::size_t stride)
        : comm(world.split(0, world.rank())), topo(comm), kernels(comm), cx(base) {
      cx.transport = &comm;
      cx.topology = &topo;
      cx.kernels = &kernels;
      eng.emplace(cx);
      th.emplace([this, k, stride](std::size_t j, std::size_t) {
        const std::size_t b = static_cast<std::size_t>(k) + j * stride;
        traced_bucket(cx, b, [&] { eng->exchange(b); });
        return true;
      });
    }
    T comm;
    Topo topo;
    Kern kernels;
    Ctx cx;
    std::optional<Eng> eng;
    std::optional<issuing_thread> th;  // last: stops before the rest goes
  };

 public:
  overlap_runner(Ctx& base, Eng&) {
    // Collective: every rank splits N times, in the same order, here in the constructor.
    for (int k = 0; k < N; ++k) lanes_.push_back(std::make_unique<lane>(*base.transport, base, k, std::size_t{N}));
  }
  void post(std::size_t b) { lanes_[b % N]->th->post(); }
  void drain() {
    std::exception_ptr first;
    for (auto& l : lanes_) {
      try {
        l->th->drain();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  void replan() {
    for (auto& l : lanes_) l->eng->replan();
  }
  std::size_t take_nonfinite() {
    std::size_t n = 0;
    for (auto& l : lanes_) n += l->kernels.take_nonfinite();
    return n;
  }

 private:
  std::vector<std::unique_ptr<lane>> lanes_;
};

// ---- Chained: start as soon as ready, complete in order ------------------------------------------
template <class Ctx, class Eng>
class overlap_runner<Chained, Ctx, Eng> {
  using request = typename Eng::request;

 public:
  overlap_runner(Ctx& cx, Eng& e)
      : cx_(&cx), e_(&e), th_([this](std::size_t done, std::size_t posted) { return step(done, posted); }) {
    replan();
  }
  overlap_runner(const overlap_runner&) = delete;
  overlap_runner& operator=(const overlap_runner&) = delete;
  /// Destroyed mid-iteration (e.g. finish() refused a missing tensor): the thread stops after its
  /// current step, and what it started is settled before the buffers go.
  ~overlap_runner() {
    th_.stop();
    settle_started();
  }
  void post(std::size_t) { th_.post(); }
  /// After drain() the thread is idle (it waits for a post), so its counters can be read and reset
  /// here; post() orders these writes before its next step.
  void drain() {
    try {
      th_.drain();
    } catch (...) {
      settle_started();
      started_ = waited_ = 0;
      throw;
    }
    started_ = waited_ = 0;
  }
  /// Between iterations (the thread is idle; post() orders these writes before its next step).
  void replan() {
    requests_.assign(cx_->buckets->size(), request{});
    started_at_.assign(cx_->buckets->size(), 0);
  }
  std::size_t take_nonfinite() { return 0; }

 private:
  // Starts every posted bucket before completing any; true when bucket `done` completed.
  bool step(std::size_t done, std::size_t posted) {
    if (started_ < posted) {
      const std::size_t b = started_;
      if (cx_->tracer()) started_at_[b] = timeline::now_ns();
      requests_[b] = e_->start(b);
      ++started_;
      return false;
    }
    waited_ = done + 1;  // complete() waits on this request, whether it returns or throws
    e_->complete(done, requests_[done]);
    if (timeline* tl = cx_->tracer())
      tl->span(trace_kind::bucket, static_cast<std::uint32_t>(done), *cx_->iteration, started_at_[done], timeline::now_ns(),
               (*cx_->buckets)[done].count * sizeof(typename Ctx::wire_type));
    return true;
  }

  // After an error, or when destroyed mid-iteration: a bucket started but never waited on is still
  // posted to the transport, which may run it later on this rank's buffers (the in-process
  // transport does, when the last rank posts): complete each (their own timeouts bound this), so
  // nothing outlives the exchanger.
  void settle_started() {
    for (std::size_t b = waited_; b < started_; ++b) {
      try {
        e_->complete(b, requests_[b]);
      } catch (...) {  // the iteration already failed with the first error
      }
    }
  }

  Ctx* cx_;
  Eng* e_;
  std::vector<request> requests_;
  std::vector<std::int64_t> started_at_;  // timeline: when each bucket's start() began
  std::size_t started_ = 0;               // buckets whose start() returned (the thread's; reset by drain())
  std::size_t waited_ = 0;                // buckets whose complete() ran (the thread's; reset by drain())
  issuing_thread th_;                     // last: joined before the members above go
};

// ---- compositions that cannot run: one sentence each, and nothing else to compile ---------------
/// Whether Strategy can run engine Eng: Concurrent<N> needs buckets without shared state
/// (independent_buckets), Chained an exchange split into start / complete (phased).
template <class Strategy, class Eng>
inline constexpr bool runs_on = true;
template <int N, class Eng>
inline constexpr bool runs_on<Concurrent<N>, Eng> = independent_buckets_engine<Eng>;
template <class Eng>
inline constexpr bool runs_on<Chained, Eng> = phased_engine<Eng>;

template <class Strategy>
inline constexpr bool refused_strategy = false;
template <class Strategy, class Ctx, class Eng>
class refused_runner {
  static_assert(refused_strategy<Strategy> || !std::is_same_v<Strategy, Chained>,
                "gflow::Overlap<Chained>: this sparsifier's exchange does not split into start/complete phases. "
                "Use Overlap<Funneled> with it, or Sparsifier<None>.");
  static_assert(refused_strategy<Strategy> || std::is_same_v<Strategy, Chained>,
                "gflow::Overlap<Concurrent<N>>: this sparsifier keeps state across buckets, so its buckets cannot be "
                "split over N communicators. Use Overlap<Funneled> (or Chained with Dense).");

 public:
  refused_runner(Ctx&, Eng&) {}
  void post(std::size_t) {}
  void drain() {}
  void replan() {}
  std::size_t take_nonfinite() { return 0; }
};

/// The runner for a strategy; stream-ordered (CUDA) backends enqueue from the caller's thread.
template <class Strategy, class Ctx, class Eng>
using runner_for =
    std::conditional_t<Ctx::backend::stream_ordered, overlap_runner<None, Ctx, Eng>,
                       std::conditional_t<runs_on<Strategy, Eng>, overlap_runner<Strategy, Ctx, Eng>, refused_runner<Strategy, Ctx, Eng>>>;

}  // namespace gflow::detail
