// detail::issuing_thread: the thread the Overlap runners issue their buckets' exchanges on
// (support/issuing_thread.hpp). Funneled and Concurrent finish an item per step; Chained takes
// several steps per item. In the TSan set (gflow_threaded_tests).
#include <gflow/detail/support/issuing_thread.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <stdexcept>
#include <thread>
#include <vector>

using gflow::detail::issuing_thread;

TEST_CASE("issuing_thread: one step per item, in order, on its own thread; drain waits for all and starts afresh") {
  std::vector<std::size_t> seen;  // written by the thread only; read after drain()
  std::thread::id ran_on{};
  issuing_thread t([&](std::size_t done, std::size_t) {
    seen.push_back(done);
    ran_on = std::this_thread::get_id();
    return true;
  });
  for (int round = 0; round < 3; ++round) {
    seen.clear();
    for (int i = 0; i < 50; ++i) t.post();
    t.drain();
    REQUIRE(seen.size() == 50);
    for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);  // counts start at 0 every round
    CHECK(ran_on != std::this_thread::get_id());
  }
  t.drain();  // nothing posted: returns at once
}

TEST_CASE("issuing_thread: several steps per item (Chained: start every posted item before completing any)") {
  std::vector<int> log;  // +j: started j, -j-1: completed j
  std::size_t started = 0;
  issuing_thread t([&](std::size_t done, std::size_t posted) {
    if (started < posted) {
      log.push_back(static_cast<int>(started++));
      return false;
    }
    log.push_back(-static_cast<int>(done) - 1);
    return true;
  });
  for (int round = 0; round < 2; ++round) {
    log.clear();
    for (int i = 0; i < 4; ++i) t.post();  // posted together: may be seen one by one
    t.drain();
    started = 0;  // the thread is idle after drain(): its state may be reset here
    // Every item is started and completed exactly once, each completion after its start, in order.
    std::vector<int> completed, begun;
    for (int v : log) (v >= 0 ? begun : completed).push_back(v);
    CHECK(begun == std::vector<int>{0, 1, 2, 3});
    CHECK(completed == std::vector<int>{-1, -2, -3, -4});
    for (std::size_t i = 0; i < log.size(); ++i)
      if (log[i] < 0) {
        bool was_started = false;
        for (std::size_t j = 0; j < i; ++j) was_started = was_started || log[j] == -log[i] - 1;
        CHECK(was_started);
      }
  }
}

TEST_CASE("issuing_thread: the first error reaches drain(), the rest of the items are dropped, and the thread is reusable") {
  int runs = 0;
  bool fail = true;
  issuing_thread t([&](std::size_t done, std::size_t) {
    ++runs;
    if (fail && done == 1) throw std::runtime_error("bucket 1 failed");
    return true;
  });
  for (int i = 0; i < 5; ++i) t.post();
  CHECK_THROWS_WITH_AS(t.drain(), "bucket 1 failed", std::runtime_error);
  CHECK(runs == 2);  // item 0, then item 1 threw; 2..4 dropped
  fail = false;      // the thread waits while an error is pending: drain() has cleared it
  runs = 0;
  for (int i = 0; i < 3; ++i) t.post();
  t.drain();
  CHECK(runs == 3);
}
