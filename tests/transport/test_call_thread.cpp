// detail::call_thread: the issuing thread the MPI transport's timed collectives run on.
#include <gflow/transport/call_thread.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

using gflow::detail::call_thread;
using namespace std::chrono_literals;

namespace {
std::atomic<bool> release{false};
std::atomic<int> calls{0};     // blocked_call() entered
std::atomic<int> returns{0};   // blocked_call() returned
int blocked_call() {
  calls.fetch_add(1);
  while (!release.load()) std::this_thread::sleep_for(1ms);
  returns.fetch_add(1);
  return 7;
}
}  // namespace

TEST_CASE("call_thread: runs each call on its thread and hands back the result") {
  call_thread t;
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < 200; ++i) {
    std::thread::id ran_on{};
    std::thread::id* where = &ran_on;
    t.start([i, where] {
      *where = std::this_thread::get_id();
      return i * 3;
    });
    int rc = -1;
    while (!t.wait_until(call_thread::clock::now() + 1ms, &rc)) {
    }
    CHECK(rc == i * 3);
    CHECK(ran_on != caller);
  }
}

TEST_CASE("call_thread: a wait that passes its deadline returns false and the call goes on") {
  release = false;
  calls = 0;
  call_thread t;
  t.start([] { return blocked_call(); });
  int rc = -1;
  CHECK_FALSE(t.wait_until(call_thread::clock::now() + 20ms, &rc));
  CHECK(rc == -1);
  release = true;
  CHECK(t.wait_until(call_thread::clock::now() + 10s, &rc));
  CHECK(rc == 7);
  CHECK(calls == 1);
}

TEST_CASE("call_thread: shutdown lingers for an abandoned call that returns in time") {
  release = false;
  calls = 0;
  returns = 0;
  call_thread t;
  t.start([] { return blocked_call(); });
  int rc = -1;
  CHECK_FALSE(t.wait_until(call_thread::clock::now() + 5ms, &rc));
  while (calls.load() == 0) std::this_thread::sleep_for(1ms);  // running: abandon() would withdraw a call not yet begun
  t.abandon();
  std::thread late([] {
    std::this_thread::sleep_for(20ms);
    release = true;
  });
  const auto t0 = call_thread::clock::now();
  t.shutdown(10s);  // joins once the call returns
  // It lingered: the call had returned when shutdown() did (a detach would return at once,
  // with the call still blocked for another 20 ms) ...
  CHECK(returns == 1);
  // ... and it did not wait out the whole linger once the call was back.
  CHECK(call_thread::clock::now() - t0 < 5s);
  late.join();
}

TEST_CASE("call_thread: a call still blocked at shutdown is detached, and frees itself if it ever returns") {
  release = false;
  calls = 0;
  returns = 0;
  const auto t0 = call_thread::clock::now();
  {
    call_thread t;
    t.start([] { return blocked_call(); });
    while (calls.load() == 0) std::this_thread::sleep_for(1ms);
    t.abandon();
  }  // destructor: linger 0, the call is running: detached
  // Detached, not joined: the destructor came back with the call still blocked in it (a join
  // would never come back, a linger would take its time).
  CHECK(returns == 0);
  CHECK(call_thread::clock::now() - t0 < 5s);
  release = true;  // the orphaned thread returns, deletes its state and exits (ASan/TSan would see a leak or race)
  const auto until = call_thread::clock::now() + 10s;
  while (returns.load() == 0 && call_thread::clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(returns == 1);  // the orphan ran on and returned once released
  std::this_thread::sleep_for(50ms);  // let it delete its state before the process checks for leaks
}
