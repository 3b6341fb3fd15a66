#pragma once
// The issuing side of the Overlap policies (policies/overlap.hpp says what each one means).
// A runner receives post(b) from ready() for every bucket, in pool order, once per iteration,
// and drain() from finish(), which returns once every posted bucket is exchanged or rethrows the
// first error of an issuing thread.
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "../policies/overlap.hpp"
#include "../timeline.hpp"

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

// One issuing thread that runs work(j) for j = 0, 1, 2, ... as they are posted.
class issuing_thread {
 public:
  explicit issuing_thread(std::function<void(std::size_t)> work) : work_(std::move(work)), th_([this] { loop(); }) {}
  issuing_thread(const issuing_thread&) = delete;
  issuing_thread& operator=(const issuing_thread&) = delete;
  ~issuing_thread() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void post() {
    {
      std::lock_guard lk(m_);
      ++posted_;
    }
    cv_.notify_all();
  }
  /// Waits until every posted item ran; rethrows the first error; starts the count afresh.
  void drain() {
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return done_ == posted_ || error_; });
    std::exception_ptr e = std::exchange(error_, nullptr);
    // after an error the remaining items are dropped: the exchange of this iteration failed
    posted_ = done_ = 0;
    if (e) std::rethrow_exception(e);
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || (!error_ && done_ < posted_); });
      if (stop_) return;
      const std::size_t j = done_;
      lk.unlock();
      try {
        work_(j);
        lk.lock();
        ++done_;
      } catch (...) {
        lk.lock();
        error_ = std::current_exception();
      }
      done_cv_.notify_all();
    }
  }

  std::function<void(std::size_t)> work_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::size_t posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread th_;
};

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
  overlap_runner(Ctx& cx, Eng& e) : cx_(&cx), e_(&e), th_([this](std::size_t b) { traced_bucket(*cx_, b, [&] { e_->exchange(b); }); }) {}
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
  static_assert(Eng::independent_buckets,
                "gflow::Overlap<Concurrent<N>>: this sparsifier keeps state across buckets, so its buckets cannot be "
                "split over N communicators. Use Overlap<Funneled> (or Chained with Dense).");
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
      th.emplace([this, k, stride](std::size_t j) {
        const std::size_t b = static_cast<std::size_t>(k) + j * stride;
        traced_bucket(cx, b, [&] { eng->exchange(b); });
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
  static_assert(Eng::phased,
                "gflow::Overlap<Chained>: this sparsifier's exchange does not split into start/complete phases. "
                "Use Overlap<Funneled> with it, or Sparsifier<Dense>.");
  using request = typename Eng::request;

 public:
  overlap_runner(Ctx& cx, Eng& e) : cx_(&cx), e_(&e), th_([this] { loop(); }) { replan(); }
  overlap_runner(const overlap_runner&) = delete;
  overlap_runner& operator=(const overlap_runner&) = delete;
  ~overlap_runner() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void post(std::size_t) {
    {
      std::lock_guard lk(m_);
      ++posted_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return completed_ == posted_ || error_; });
    std::exception_ptr e = std::exchange(error_, nullptr);
    posted_ = started_ = completed_ = 0;
    if (e) std::rethrow_exception(e);
  }
  void replan() {
    std::lock_guard lk(m_);
    requests_.assign(cx_->buckets->size(), request{});
    started_at_.assign(cx_->buckets->size(), 0);
  }
  std::size_t take_nonfinite() { return 0; }

 private:
  void loop() {
    std::unique_lock lk(m_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || (!error_ && completed_ < posted_); });
      if (stop_) return;
      try {
        if (started_ < posted_) {  // start every bucket that is ready before completing any
          const std::size_t b = started_++;
          lk.unlock();
          if (cx_->tracer()) started_at_[b] = timeline::now_ns();
          requests_[b] = e_->start(b);
          lk.lock();
        } else {
          const std::size_t b = completed_;
          lk.unlock();
          e_->complete(b, requests_[b]);
          if (timeline* tl = cx_->tracer())
            tl->span(trace_kind::bucket, static_cast<std::uint32_t>(b), *cx_->iteration, started_at_[b], timeline::now_ns(),
                     (*cx_->buckets)[b].count * sizeof(typename Ctx::wire_type));
          lk.lock();
          ++completed_;
          done_cv_.notify_all();
        }
      } catch (...) {
        if (!lk.owns_lock()) lk.lock();
        error_ = std::current_exception();
        done_cv_.notify_all();
      }
    }
  }

  Ctx* cx_;
  Eng* e_;
  std::vector<request> requests_;
  std::vector<std::int64_t> started_at_;  // timeline: when each bucket's start() began
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::size_t posted_ = 0, started_ = 0, completed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread th_;
};

/// The runner for a strategy; stream-ordered (CUDA) backends enqueue from the caller's thread.
template <class Strategy, class Ctx, class Eng>
using runner_for = std::conditional_t<Ctx::backend::stream_ordered, overlap_runner<None, Ctx, Eng>, overlap_runner<Strategy, Ctx, Eng>>;

}  // namespace gflow::detail
