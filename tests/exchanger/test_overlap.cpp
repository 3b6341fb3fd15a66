#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_inproc;

namespace {

float value(int rank, std::size_t i, std::size_t j, int it) {
  return static_cast<float>((rank * 131 + static_cast<int>(i) * 17 + static_cast<int>(j % 97) * 3 + it * 7) % 41) * 0.25f - 5.0f;
}

// Runs `iters` iterations of E on P in-process ranks; each rank calls ready() in its own random
// order with random short pauses (seeded). Returns rank 0's pool after every iteration, and
// checks all ranks are bitwise identical.
template <class E>
std::vector<std::vector<float>> run(int P, const Layout& l, unsigned seed, int iters = 3, bool pauses = true) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(P));
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    std::mt19937 rng(seed * 1000 + static_cast<unsigned>(t.rank()));
    for (int it = 0; it < iters; ++it) {
      std::vector<std::size_t> order(l.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (auto i : order) {
        auto v = ex.view(i);
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = value(t.rank(), i, j, it);
        if (pauses && rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        ex.ready(i);
      }
      auto st = ex.finish();
      CHECK(st.finite());
      out[static_cast<std::size_t>(t.rank())].emplace_back(ex.pool_data(), ex.pool_data() + ex.pool_size());
    }
  });
  for (int r = 1; r < P; ++r)
    for (int it = 0; it < iters; ++it)
      CHECK(out[static_cast<std::size_t>(r)][static_cast<std::size_t>(it)] == out[0][static_cast<std::size_t>(it)]);
  return out[0];
}

const Layout& layout() {
  static const Layout l = Layout::from_sizes({300, 7, 1024, 64, 1, 513, 2048, 5, 90});
  return l;
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("every overlap strategy gives the None result bit for bit, whatever the ready() order", S, strategies_id) {
  using Ref = Exchanger<Fusion<2048>>;
  using E = Exchanger<Fusion<2048>, Overlap<S>>;
  using Ref16 = Exchanger<Fusion<1024>, Precision<half>>;
  using E16 = Exchanger<Fusion<1024>, Precision<half>, Overlap<S>>;
  for (int P : {1, 2, 3, 5}) {
    for (unsigned seed = 0; seed < 6; ++seed) {
      CAPTURE(P);
      CAPTURE(seed);
      CHECK(run<E>(P, layout(), seed) == run<Ref>(P, layout(), seed, 3, false));
      CHECK(run<E16>(P, layout(), seed) == run<Ref16>(P, layout(), seed, 3, false));
    }
  }
}

TEST_CASE_TEMPLATE_APPLY(strategies_id, gflow_test::strategies);

TEST_CASE_TEMPLATE("with an issuing thread, ready() does not wait for the other ranks", S, Funneled, Concurrent<2>, Chained) {
  // Rank 1 starts only after rank 0 has made every ready() call. If ready() waited for a
  // collective, rank 0 could never get there: the transport would time out instead.
  using E = Exchanger<Fusion<1024>, Overlap<S>>;
  std::latch rank0_posted_everything(1);
  inproc::run(
      2,
      [&](inproc::transport& t) {
        on_inproc<E> ex(t, layout());
        if (t.rank() == 1) rank0_posted_everything.wait();
        for (std::size_t i = layout().size(); i-- > 0;) {
          std::fill(ex.view(i).begin(), ex.view(i).end(), float(t.rank() + 1));
          ex.ready(i);
        }
        if (t.rank() == 0) rank0_posted_everything.count_down();
        auto st = ex.finish();
        CHECK(st.finite());
        CHECK(ex.view(0)[0] == 1.5f);
        CHECK(ex.view(8)[89] == 1.5f);
      },
      std::chrono::seconds(20));
}

TEST_CASE("Overlap<None> does wait in ready(): the same schedule times out") {
  using E = Exchanger<Fusion<1024>>;
  std::latch rank0_posted_everything(1);
  std::atomic<int> timeouts{0};
  inproc::run(
      2,
      [&](inproc::transport& t) {
        on_inproc<E> ex(t, layout());
        try {
          if (t.rank() == 1) rank0_posted_everything.wait();
          for (std::size_t i = layout().size(); i-- > 0;) ex.ready(i);
        } catch (const gflow::timeout_error&) {
          ++timeouts;
        }
        if (t.rank() == 0) rank0_posted_everything.count_down();
      },
      std::chrono::milliseconds(300));
  CHECK(timeouts >= 1);
}

TEST_CASE_TEMPLATE("an error on an issuing thread surfaces at finish(), never a hang", S, Funneled, Concurrent<2>, Chained) {
  using E = Exchanger<Fusion<1024>, Overlap<S>>;
  std::atomic<int> reported{0};
  inproc::run(
      3,
      [&](inproc::transport& t) {
        on_inproc<E> ex(t, layout());
        // rank 2 never marks tensor 0 ready: its last bucket is never issued, the others time out
        for (std::size_t i = layout().size(); i-- > 0;)
          if (!(t.rank() == 2 && i == 0)) ex.ready(i);
        try {
          (void)ex.finish();
        } catch (const gflow::timeout_error& e) {
          ++reported;
          CHECK(std::string(e.what()).find("did not arrive") != std::string::npos);
        } catch (const gflow::usage_error& e) {
          CHECK(t.rank() == 2);  // its own finish() reports the missing tensor
          ++reported;
        }
      },
      std::chrono::milliseconds(500));
  CHECK(reported == 3);
}

TEST_CASE("issuing threads survive many iterations and set_fusion between them") {
  using E = Exchanger<Fusion<4096>, Overlap<Chained>>;
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout());
    for (int it = 0; it < 20; ++it) {
      if (it == 10) ex.set_fusion(256);
      for (std::size_t i = 0; i < layout().size(); ++i) {
        std::fill(ex.view(i).begin(), ex.view(i).end(), float(t.rank()));
        ex.ready(i);
      }
      CHECK(ex.finish().finite());
      CHECK(ex.view(3)[63] == 1.5f);
    }
  });
}

// ---- a transport whose completions the test controls (stdexec's "impulse" idea) ----------------
namespace {
// Every collective a rank issues waits for a ticket that the test's controller thread hands out,
// one at a time, to a randomly chosen rank that is waiting. So the test, not the scheduler,
// decides in which order the ranks' collectives may proceed.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  std::vector<int> waiting;  // per rank: collectives waiting for a ticket
  std::vector<int> tickets;  // per rank: tickets handed out, not yet used
  bool open = false;         // after the run: let everything through
  explicit gate(int P) : waiting(static_cast<std::size_t>(P)), tickets(static_cast<std::size_t>(P)) {}
  void pass(int rank) {
    std::unique_lock lk(m);
    ++waiting[static_cast<std::size_t>(rank)];
    cv.notify_all();
    cv.wait(lk, [&] { return open || tickets[static_cast<std::size_t>(rank)] > 0; });
    if (!open) --tickets[static_cast<std::size_t>(rank)];
    --waiting[static_cast<std::size_t>(rank)];
  }
};

class gated : public inproc::transport {
 public:
  gated(inproc::transport t, gate* g) : inproc::transport(std::move(t)), g_(g) {}
  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    g_->pass(rank());
    return inproc::transport::iall_reduce(buf, n, op);
  }
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    g_->pass(rank());
    inproc::transport::all_reduce(buf, n, op);
  }
  gated split(int color, int key) { return gated(inproc::transport::split(color, key), g_); }

 private:
  gate* g_;
};
static_assert(gflow::transport<gated>);
}  // namespace

TEST_CASE_TEMPLATE("ranks complete in whatever order the test releases their collectives", S, None, Funneled, Concurrent<2>, Chained) {
  using E = Exchanger<Fusion<1024>, Overlap<S>>;
  constexpr int P = 3;
  for (unsigned seed = 0; seed < 8; ++seed) {
    CAPTURE(seed);
    gate g(P);
    std::atomic<int> finished{0};
    std::vector<std::vector<float>> out(P);
    std::thread controller([&] {
      std::mt19937 rng(seed);
      while (finished.load() < P) {
        std::unique_lock lk(g.m);
        g.cv.wait_for(lk, std::chrono::milliseconds(2), [&] {
          for (int r = 0; r < P; ++r)
            if (g.waiting[static_cast<std::size_t>(r)] > g.tickets[static_cast<std::size_t>(r)]) return true;
          return false;
        });
        std::vector<int> candidates;
        for (int r = 0; r < P; ++r)
          if (g.waiting[static_cast<std::size_t>(r)] > g.tickets[static_cast<std::size_t>(r)]) candidates.push_back(r);
        if (candidates.empty()) continue;
        ++g.tickets[static_cast<std::size_t>(candidates[rng() % candidates.size()])];  // release one rank's next collective
        lk.unlock();
        g.cv.notify_all();
        if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      }
    });
    inproc::run(
        P,
        [&](inproc::transport& base) {
          gated t(base, &g);
          typename E::template on<gated> ex(t, layout());
          std::mt19937 rng(seed * 31 + static_cast<unsigned>(t.rank()));
          std::vector<std::size_t> order(layout().size());
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), rng);
          for (auto i : order) {
            auto v = ex.view(i);
            for (std::size_t j = 0; j < v.size(); ++j) v[j] = value(t.rank(), i, j, 0);
            ex.ready(i);
          }
          CHECK(ex.finish().finite());
          out[static_cast<std::size_t>(t.rank())].assign(ex.pool_data(), ex.pool_data() + ex.pool_size());
          ++finished;
        },
        std::chrono::seconds(30));
    {
      std::lock_guard lk(g.m);
      g.open = true;
    }
    g.cv.notify_all();
    controller.join();
    CHECK(out[1] == out[0]);
    CHECK(out[2] == out[0]);
    CHECK(out[0] == run<Exchanger<Fusion<1024>>>(P, layout(), 0, 1, false)[0]);
  }
}
