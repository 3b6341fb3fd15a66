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
std::atomic<int> calls{0};
int blocked_call() {
  calls.fetch_add(1);
  while (!release.load()) std::this_thread::sleep_for(1ms);
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
  call_thread t;
  t.start([] { return blocked_call(); });
  int rc = -1;
  CHECK_FALSE(t.wait_until(call_thread::clock::now() + 5ms, &rc));
  t.abandon();
  std::thread late([] {
    std::this_thread::sleep_for(20ms);
    release = true;
  });
  const auto t0 = call_thread::clock::now();
  t.shutdown(10s);  // joins once the call returns
  CHECK(call_thread::clock::now() - t0 < 5s);
  late.join();
}

TEST_CASE("call_thread: a call still blocked at shutdown is detached, and frees itself if it ever returns") {
  release = false;
  calls = 0;
  {
    call_thread t;
    t.start([] { return blocked_call(); });
    while (calls.load() == 0) std::this_thread::sleep_for(1ms);
    t.abandon();
  }  // destructor: linger 0, the call is running: detached
  release = true;  // the orphaned thread returns, deletes its state and exits (ASan/TSan would see a leak or race)
  std::this_thread::sleep_for(50ms);
  CHECK(calls == 1);
}
