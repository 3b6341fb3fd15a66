#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <vector>

#include "compositions.hpp"
#include "test_values.hpp"

// ---- allocation counter: the hot path (ready/finish) must not allocate ------------------------
namespace gflow_test {  // also read by the allocation checks of engines/test_topk_wire.cpp and engines/test_oktopk.cpp
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
// Set on a thread while it runs code whose allocations a test does not count (an in-process
// transport's own bookkeeping: engines/test_oktopk.cpp's uncounted_transport).
thread_local bool t_uncounted = false;
}  // namespace gflow_test
using gflow_test::g_allocs;
using gflow_test::g_counting;
// GCC 12 flags free() inside a replaced operator delete as mismatched; the pair is consistent.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed) && !gflow_test::t_uncounted) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The rest of the unaligned family, so that every new/delete pair goes through malloc/free (the
// library's nothrow new, e.g. std::stable_sort's temporary buffer, would otherwise meet our delete).
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_counting.load(std::memory_order_relaxed) && !gflow_test::t_uncounted) ++g_allocs;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

using namespace gflow;
using gflow_test::mock_t;
using gflow_test::on_mock;
using gflow_test::on_inproc;

namespace {

std::vector<std::size_t> small_sizes() { return {1000, 3, 257, 4096, 1, 77, 512}; }

}  // namespace

TEST_CASE("mock: without Fusion, one allreduce per tensor in pool order with exact byte counts") {
  auto l = Layout::from_sizes(small_sizes());
  mock_t m(4);
  on_mock<Exchanger<>> ex(m, l);
  for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);  // forward order: nothing can launch until the last
  auto st = ex.finish();
  auto ar = m.calls().of(mock::op::all_reduce);
  REQUIRE(ar.size() == l.size());
  for (std::size_t k = 0; k < ar.size(); ++k) {
    const std::size_t t = l.size() - 1 - k;  // generation order
    CHECK(ar[k].count == l[t].numel);
    CHECK(ar[k].bytes == 4 * l[t].numel);
    CHECK(ar[k].type == dtype::f32);
    CHECK_FALSE(ar[k].async);  // Overlap<None>: blocking collectives
  }
  CHECK(st.collectives == l.size());
  CHECK(st.wire_bytes == 4 * l.total_numel());
}

TEST_CASE("mock: lazy allreduce launches a bucket as soon as the ready prefix covers it") {
  // pool order: t3 (11), t2 (7), t1 (5), t0 (3); fp32 threshold 40 B -> buckets [t3] [t2 t1] [t0]
  auto l = Layout::from_sizes({3, 5, 7, 11});
  mock_t m(2);
  on_mock<Exchanger<Fusion<40>>> ex(m, l);
  REQUIRE(ex.buckets().size() == 3);
  auto launched = [&] { return m.calls().of(mock::op::all_reduce).size(); };
  ex.ready(1);
  CHECK(launched() == 0);  // t1 ready but the prefix starts at t3
  ex.ready(3);
  CHECK(launched() == 1);  // [t3] launches alone
  ex.ready(0);
  CHECK(launched() == 1);  // t0 ready but t2 is not: order is kept
  ex.ready(2);
  CHECK(launched() == 3);  // [t2 t1] then the remainder [t0], in pool order
  auto ar = m.calls().of(mock::op::all_reduce);
  CHECK(ar[0].count == 11);
  CHECK(ar[1].count == 12);
  CHECK(ar[2].count == 3);
  (void)ex.finish();
  CHECK(m.calls().of(mock::op::all_reduce).size() == 3);  // finish() issues nothing more
  CHECK(m.calls().of(mock::op::wait).empty());
}

TEST_CASE("mock: fp16 and bf16 wires send 2 bytes per element and fuse by wire bytes") {
  auto l = Layout::from_sizes({3, 5, 7, 11});
  mock_t m(4);
  on_mock<Exchanger<Precision<half>, Fusion<40>>> ex(m, l);
  for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
  auto ar = m.calls().of(mock::op::all_reduce);
  REQUIRE(ar.size() == 2);  // 22+14+10 = 46 B >= 40, then 6 B
  CHECK(ar[0].type == dtype::f16);
  CHECK(ar[0].bytes == 46);
  CHECK(ar[1].bytes == 6);
  (void)ex.finish();

  mock_t m2(4);
  on_mock<Exchanger<Fusion<1 << 20>, Precision<bfloat16>>> ex2(m2, l);
  for (std::size_t i = l.size(); i-- > 0;) ex2.ready(i);
  auto ar2 = m2.calls().of(mock::op::all_reduce);
  REQUIRE(ar2.size() == 1);
  CHECK(ar2[0].type == dtype::bf16);
  CHECK(ar2[0].bytes == 52);
}

TEST_CASE("mock: first bucket cap and run-time threshold override") {
  auto l = Layout::from_sizes({100, 100, 100, 100, 100, 100});  // 400 B each in fp32
  mock_t m(2);
  on_mock<Exchanger<Fusion<1200, 400>>> ex(m, l);
  CHECK(ex.buckets().size() == 3);  // [1] [3] [2]
  CHECK(ex.buckets()[0].count == 100);
  CHECK(ex.buckets()[1].count == 300);
  CHECK(ex.buckets()[2].count == 200);
  ex.set_fusion(800);
  CHECK(ex.buckets().size() == 3);
  CHECK(ex.threshold_bytes() == 800);

  on_mock<Exchanger<Fusion<400>>> ex2(m, l);
  ex2.set_fusion(2000);
  CHECK(ex2.buckets().size() == 2);  // [5] [1]
  CHECK_THROWS_AS(ex2.set_fusion(0), gflow::invalid_argument);
}

TEST_CASE("mock: averaged values come back in the views") {
  auto l = Layout::from_sizes({3, 4});
  mock_t m(4);  // every rank holds the same data: mean == input
  on_mock<Exchanger<Fusion<8>>> ex(m, l);
  for (int it = 0; it < 3; ++it) {
    for (std::size_t i = 0; i < 2; ++i) {
      auto v = ex.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = float(j) + 0.5f;
      ex.ready(i);
    }
    auto st = ex.finish();
    CHECK(st.finite());
    CHECK(st.iteration == std::uint64_t(it));
    CHECK(ex.view(1)[3] == 3.5f);
  }
}

TEST_CASE("copying ready(i, source) path") {
  auto l = Layout::from_sizes({3, 2});
  mock_t m(2);
  on_mock<Exchanger<>> ex(m, l);
  std::vector<float> a{1, 2, 3}, b{4, 5};
  ex.ready(1, b);
  ex.ready(0, a);
  (void)ex.finish();
  CHECK(ex.view(0)[2] == 3.0f);
  CHECK(ex.view(1)[0] == 4.0f);
  std::vector<float> wrong(4);
  try {
    ex.ready(0, wrong);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "source");
    CHECK(std::string(e.what()).find("got 4 elements; tensor 0 ('t0') has 3") != std::string::npos);
  }
}

TEST_CASE("misuse raises typed errors that name the parameter and the fix") {
  auto l = Layout::from_sizes({3, 2});
  mock_t m(2);
  on_mock<Exchanger<>> ex(m, l);
  SUBCASE("index out of range") {
    try {
      ex.ready(2);
      FAIL("expected an error");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == "tensor");
      CHECK(std::string(e.what()).find("index out of range; the layout has 2 tensors") != std::string::npos);
    }
    CHECK_THROWS_AS((void)ex.view(7), gflow::invalid_argument);
  }
  SUBCASE("ready twice") {
    ex.ready(0);
    try {
      ex.ready(0);
      FAIL("expected an error");
    } catch (const gflow::usage_error& e) {
      CHECK(e.subject() == "ready");
      CHECK(std::string(e.what()).find("marked ready twice in iteration 0") != std::string::npos);
    }
  }
  SUBCASE("finish with tensors not ready") {
    ex.ready(1);
    try {
      (void)ex.finish();
      FAIL("expected an error");
    } catch (const gflow::usage_error& e) {
      CHECK(e.subject() == "finish");
      CHECK(std::string(e.what()).find("1 of 2 tensors are not ready in iteration 0; the first is tensor 0 ('t0')") != std::string::npos);
    }
  }
  SUBCASE("set_fusion mid-iteration") {
    ex.ready(0);
    CHECK_THROWS_AS(ex.set_fusion(64), gflow::usage_error);
  }
  SUBCASE("threshold 0 at run time") {
    on_mock<Exchanger<Fusion<64>>> ex0(m, l);
    CHECK_THROWS_AS(ex0.set_fusion(0), gflow::invalid_argument);
    CHECK(ex0.threshold_bytes() == 64);
  }
  SUBCASE("empty layout") { CHECK_THROWS_AS(Layout::from_sizes(std::vector<std::size_t>{}), gflow::invalid_argument); }
}

TEST_CASE("fp16 wire: divide before the cast, report inf/NaN, never apply silently") {
  auto l = Layout::from_sizes({4});
  SUBCASE("60000 averaged over 4 ranks stays finite (the fp16 sum would overflow)") {
    inproc::run(4, [&](inproc::transport& t) {
      on_inproc<Exchanger<Precision<half>>> ex(t, l);
      std::fill(ex.view(0).begin(), ex.view(0).end(), 60000.0f);
      ex.ready(0);
      auto st = ex.finish();
      CHECK(st.finite());
      CHECK(ex.view(0)[0] == 60000.0f);
    });
  }
  SUBCASE("values beyond fp16 range are reported") {
    inproc::run(4, [&](inproc::transport& t) {
      on_inproc<Exchanger<Precision<half>>> ex(t, l);
      std::fill(ex.view(0).begin(), ex.view(0).end(), 1e6f);
      ex.ready(0);
      auto st = ex.finish();
      CHECK_FALSE(st.finite());
      CHECK(st.nonfinite == 4);
    });
  }
  SUBCASE("a NaN on one rank is reported on every rank, for every wire") {
    inproc::run(3, [&](inproc::transport& t) {
      on_inproc<Exchanger<>> e32(t, l);
      on_inproc<Exchanger<Precision<bfloat16>>> e16(t, l);
      for (auto* v : {&e32.view(0)[0]}) *v = 1.0f;
      e32.view(0)[2] = t.rank() == 1 ? std::nanf("") : 0.0f;
      std::copy(e32.view(0).begin(), e32.view(0).end(), e16.view(0).begin());
      e32.ready(0);
      e16.ready(0);
      CHECK(e32.finish().nonfinite == 1);
      CHECK(e16.finish().nonfinite == 1);
    });
  }
}

namespace {
// Runs `iters` iterations of composition E on P in-process ranks with ready() in a
// rank-dependent random order; checks against the float64 mean and bitwise across ranks.
template <class E>
void check_exchange(int P, const Layout& l, double rel_tol, double abs_tol, int iters = 2) {
  const std::size_t total = l.total_numel();
  std::vector<std::vector<float>> results(static_cast<std::size_t>(P), std::vector<float>(total));
  for (int it = 0; it < iters; ++it) {
    inproc::run(P, [&](inproc::transport& t) {
      static thread_local int dummy = 0;
      (void)dummy;
      on_inproc<E> ex(t, l);
      for (int warm = 0; warm <= it; ++warm) {
        for (std::size_t i = 0; i < l.size(); ++i) {
          auto v = ex.view(i);
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = gflow_test::uniform_value(t.rank(), i, j, warm);
        }
        std::vector<std::size_t> order(l.size());
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 rng(static_cast<unsigned>(t.rank() * 7919 + warm));
        std::shuffle(order.begin(), order.end(), rng);
        for (auto i : order) ex.ready(i);
        auto st = ex.finish();
        CHECK(st.finite());
      }
      auto& out = results[static_cast<std::size_t>(t.rank())];
      std::size_t k = 0;
      for (std::size_t i = 0; i < l.size(); ++i)
        for (float x : ex.view(i)) out[k++] = x;
    });
    // reference mean in float64
    std::size_t k = 0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < l.size(); ++i)
      for (std::size_t j = 0; j < l[i].numel; ++j, ++k) {
        double ref = 0;
        for (int r = 0; r < P; ++r) ref += gflow_test::uniform_value(r, i, j, it);
        ref /= P;
        const double got = results[0][k];
        if (std::abs(got - ref) > abs_tol + rel_tol * std::abs(ref)) ++bad;
      }
    CHECK(bad == 0);
    for (int r = 1; r < P; ++r)
      CHECK(std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(), total * sizeof(float)) == 0);
  }
}
}  // namespace

TEST_CASE_TEMPLATE("in-process: result equals the float64 mean and is bitwise identical on every rank", E, Exchanger<>,
                   Exchanger<Fusion<4096>>, Exchanger<Fusion<1 << 20, 1024>>) {
  auto l = Layout::from_sizes(small_sizes());
  for (int P : {1, 2, 3, 4, 7, 16}) {
    CAPTURE(P);
    check_exchange<E>(P, l, 1e-6, 1e-7);
  }
}

TEST_CASE_TEMPLATE("in-process 16-bit wires stay within their rounding", E, Exchanger<Precision<half>, Fusion<2048>>,
                   Exchanger<Fusion<2048>, Precision<bfloat16>>) {
  auto l = Layout::from_sizes(small_sizes());
  const bool bf = std::is_same_v<typename E::policies::precision::wire_type, bfloat16>;
  // Error bound: each rank rounds x_r/P (|err| <= u*|x_r|/P, u = half an ulp at 1), the P
  // errors add up to at most u*max|x| = u (inputs are in [-1, 1)), then the sum is rounded once
  // more (u*|mean|). So |got - mean| <= u + u*|mean|: absolute u, relative u, with u = 2^-(p+1).
  const double u = bf ? 1.0 / 256 : 1.0 / 2048;
  for (int P : {2, 5, 16}) {
    CAPTURE(P);
    check_exchange<E>(P, l, u, u);
  }
}

TEST_CASE("in-process: resnet50 layout, 4 ranks, DDP-style buckets") {
  auto l = Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/resnet50.tsv");
  check_exchange<Exchanger<Fusion<25 << 20, 1 << 20>>>(4, l, 1e-6, 1e-7, 1);
}

TEST_CASE("an iteration allocates nothing (mock transport, reserved log)") {
  auto l = Layout::from_sizes(small_sizes());
  mock_t m(4);
  on_mock<Exchanger<Precision<half>, Fusion<4096>>> ex(m, l);
  m.calls().records.reserve(10000);
  g_allocs = 0;
  g_counting = true;
  for (int it = 0; it < 5; ++it) {
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
  }
  g_counting = false;
  CHECK(g_allocs == 0);
}

TEST_CASE("exchange_status.collectives counts what the sparsifier issued, not buckets") {
  auto l = Layout::from_sizes(small_sizes());
  {
    mock_t m(4);
    on_mock<Exchanger<Sparsifier<TopK<0.01>>>> ex(m, l);  // no Fusion: one selection over the pool
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    auto st = ex.finish();
    CHECK(st.collectives == 1);
    CHECK(st.collectives == m.calls().of(mock::op::all_gather).size());
  }
  {
    mock_t m(4, 0);  // rank 0 of 4: receives in both tree rounds, then broadcasts
    on_mock<Exchanger<Sparsifier<GTopK<0.01>>>> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    auto st = ex.finish();
    const auto& rec = m.calls().records;
    const std::size_t issued = static_cast<std::size_t>(std::count_if(rec.begin(), rec.end(), [](const mock::record& r) {
      return r.kind == mock::op::send || r.kind == mock::op::recv || r.kind == mock::op::broadcast;
    }));
    CHECK(st.collectives == 3);
    CHECK(st.collectives == issued);
  }
  {
    mock_t m(2);
    on_mock<Exchanger<Fusion<4096>>> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    CHECK(ex.finish().collectives == ex.buckets().size());
  }
}
