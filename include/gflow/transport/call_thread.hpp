#pragma once
// A thread that makes one blocking call at a time for a caller that waits with a deadline.
//
// Why: a blocking call cannot be bounded by a timeout, and the non-blocking form of the same
// operation can be much slower (Open MPI's non-blocking collectives use libnbc's schedules
// instead of the tuned blocking algorithms: 1.1-1.9x slower on the exchange benchmark, see
// docs/DESIGN.md "Timeouts"). The MPI transport hands each blocking collective to this thread
// and waits on a condition variable until the call returns or the deadline passes; the
// collective itself runs at the blocking call's speed, and the caller sleeps (it takes no CPU
// from the ranks that share the cores). The hand-off costs two thread wake-ups per call.
//
//   call_thread t;                        // the thread starts here and sleeps until a call
//   t.start([=] { return MPI_Allreduce(...); });   // a trivially copyable callable returning int
//   int rc;
//   while (!t.wait_until(next_check, &rc)) { ... answer queries, check the deadline ... }
//   t.abandon();                          // after a timeout: the call may never return
//
// One call at a time: start() requires the previous call to have been waited for (or
// abandoned). The callable is copied into the object, so the caller's frame may go away after
// abandon(). shutdown(linger) (the destructor: linger 0) gives a call abandoned after a timeout
// that long to return — it often does, once the late ranks arrive — and otherwise detaches the
// thread: it stays blocked in that call for the rest of the process, and frees its state itself
// should the call ever return.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

namespace gflow::detail {

class call_thread {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t max_callable_bytes = 96;

  call_thread() : s_(new shared) {
    shared* s = s_;
    th_ = std::thread([s] { run(s); });
  }
  call_thread(const call_thread&) = delete;
  call_thread& operator=(const call_thread&) = delete;

  ~call_thread() { shutdown(clock::duration::zero()); }

  /// Ends the thread: joins it when idle, or when its call returns within `linger`; otherwise
  /// (a call abandoned after a timeout that is still blocked) detaches it. Idempotent.
  void shutdown(clock::duration linger) {
    if (s_ == nullptr) return;
    bool orphan = false;
    {
      std::unique_lock lk(s_->m);
      s_->done.wait_for(lk, linger, [this] { return s_->state != phase::running; });
      if (s_->state == phase::running) {
        s_->orphaned = true;  // the thread deletes s_ if its call ever returns
        orphan = true;
      } else {
        s_->stop = true;
      }
    }
    if (orphan) {
      th_.detach();
    } else {
      s_->work.notify_one();
      th_.join();
      delete s_;
    }
    s_ = nullptr;
  }

  /// Starts f() on the thread. f is trivially copyable, returns int, fits max_callable_bytes.
  template <class F>
  void start(const F& f) {
    static_assert(std::is_trivially_copyable_v<F> && sizeof(F) <= max_callable_bytes && alignof(F) <= alignof(std::max_align_t),
                  "call_thread::start: pass a small trivially copyable callable (a lambda capturing pointers and numbers by value).");
    {
      std::lock_guard lk(s_->m);
      ::new (static_cast<void*>(s_->storage)) F(f);
      s_->invoke = [](const void* p) { return (*static_cast<const F*>(p))(); };
      s_->state = phase::posted;
    }
    s_->work.notify_one();
  }

  /// Waits until the call has returned (true, its result in *rc; the thread is idle again) or
  /// `until` passes (false; the call goes on).
  bool wait_until(clock::time_point until, int* rc) {
    std::unique_lock lk(s_->m);
    if (!s_->done.wait_until(lk, until, [this] { return s_->state == phase::finished; })) return false;
    *rc = s_->rc;
    s_->state = phase::idle;
    return true;
  }

  /// Waits up to `d` for a call in progress (an abandoned one included) to return; true when
  /// none is in progress.
  bool wait_idle(clock::duration d) {
    std::unique_lock lk(s_->m);
    return s_->done.wait_for(lk, d, [this] { return s_->state != phase::running; });
  }

  /// Gives up on the current call. A call the thread has not begun is withdrawn; one in progress
  /// goes on (it cannot be interrupted) and its result is dropped.
  void abandon() {
    std::lock_guard lk(s_->m);
    if (s_->state == phase::posted || s_->state == phase::finished) s_->state = phase::idle;
    else if (s_->state == phase::running) s_->dropped = true;
  }

 private:
  enum class phase { idle, posted, running, finished };
  struct shared {
    std::mutex m;
    std::condition_variable work, done;
    phase state = phase::idle;
    bool stop = false;
    bool orphaned = false;
    bool dropped = false;
    int rc = 0;
    int (*invoke)(const void*) = nullptr;
    alignas(std::max_align_t) unsigned char storage[max_callable_bytes];
  };

  static void run(shared* s) {
    std::unique_lock lk(s->m);
    for (;;) {
      s->work.wait(lk, [s] { return s->stop || s->state == phase::posted; });
      if (s->stop) return;
      s->state = phase::running;
      alignas(std::max_align_t) unsigned char local[max_callable_bytes];  // the caller may start() again after abandon()
      std::memcpy(local, s->storage, max_callable_bytes);
      int (*const invoke)(const void*) = s->invoke;
      lk.unlock();
      const int rc = invoke(local);
      lk.lock();
      if (s->orphaned) {
        lk.unlock();
        delete s;
        return;
      }
      s->rc = rc;
      s->state = s->dropped ? phase::idle : phase::finished;
      s->dropped = false;
      lk.unlock();
      s->done.notify_all();
      lk.lock();
    }
  }

  shared* s_;
  std::thread th_;
};

}  // namespace gflow::detail
