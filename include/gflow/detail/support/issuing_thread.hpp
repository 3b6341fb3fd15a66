#pragma once
// issuing_thread: one thread that works through items as they are posted, in order, and reports
// the first error to the side that drains it. The Overlap runners (exchanger/runners.hpp) issue
// their buckets' exchanges on it: Funneled and each Concurrent<N> lane finish an item per step;
// Chained takes several steps per item (it starts every posted bucket before completing any).
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace gflow::detail {

class issuing_thread {
 public:
  /// step(done, posted) runs on the thread, without the lock, whenever done < posted; it returns
  /// true when it finished item `done` (one step per item: always true).
  using step_fn = std::function<bool(std::size_t done, std::size_t posted)>;

  explicit issuing_thread(step_fn step) : step_(std::move(step)), th_([this] { loop(); }) {}
  issuing_thread(const issuing_thread&) = delete;
  issuing_thread& operator=(const issuing_thread&) = delete;
  ~issuing_thread() { stop(); }

  /// Lets the thread finish the step it is in, then ends it (posted items not begun are dropped).
  /// Afterwards what its steps wrote may be read. Idempotent.
  void stop() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (th_.joinable()) th_.join();
  }

  /// One more item.
  void post() {
    {
      std::lock_guard lk(m_);
      ++posted_;
    }
    cv_.notify_all();
  }

  /// Waits until every posted item finished; rethrows the first error; starts the counts afresh.
  /// After an error the remaining items are dropped: the exchange of this iteration failed. On
  /// return (or throw) the thread is idle until the next post(): what its steps wrote may be read
  /// and reset by the caller.
  void drain() {
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return done_ == posted_ || error_; });
    std::exception_ptr e = std::exchange(error_, nullptr);
    posted_ = done_ = 0;
    if (e) std::rethrow_exception(e);
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || (!error_ && done_ < posted_); });
      if (stop_) return;
      const std::size_t done = done_, posted = posted_;
      lk.unlock();
      try {
        const bool finished = step_(done, posted);
        lk.lock();
        if (finished) {
          ++done_;
          done_cv_.notify_all();
        }
      } catch (...) {
        if (!lk.owns_lock()) lk.lock();
        error_ = std::current_exception();
        done_cv_.notify_all();
      }
    }
  }

  step_fn step_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::size_t posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread th_;  // last: started after every member above exists, joined before they go
};

}  // namespace gflow::detail
