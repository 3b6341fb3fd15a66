// Sparsifier<CSC<chunk_elems, percent>> on the wire (mock transport): the collectives of sparse and
// dense warm-up iterations; bad settings.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compositions.hpp"
#include "csc_reference.hpp"

using namespace gflow;
using namespace gflow_test;

// ---- the exchanger over the mock transport: what goes on the wire ------------------------------

namespace {
// Runs `iters` iterations on the mock and checks every iteration's collectives: chunk allreduces
// in the wire type whose element counts add up to the selected chunks' elements, then exactly
// one fp32 norm allreduce of `chunks` elements when the norms are needed, and the byte count.
template <class E>
void check_wire(const Layout& l, std::uint64_t warmup, int iters, unsigned percent) {
  mock::transport m(4);
  on_mock<E> ex(m, l);
  auto& s = ex.sparsifier();
  s.set_warmup(warmup, 0);
  s.set_percent(percent);
  using W = typename on_mock<E>::wire_type;
  const std::size_t nc = s.chunk_count();
  const std::size_t threshold = ex.threshold_bytes();
  const auto ranges = gflow::detail::plan::plan_chunk_ranges(s.geometry(), ex.buckets());
  std::mt19937 rng(11);
  for (int it = 0; it < iters; ++it) {
    CAPTURE(it);
    m.calls().clear();
    const std::vector<std::uint32_t> sel(s.upcoming_chunks().begin(), s.upcoming_chunks().end());
    const std::size_t expect_k = gflow::detail::plan::csc_schedule{warmup, 0, percent}.selected(std::uint64_t(it), nc);
    CHECK(sel.size() == expect_k);
    for (std::size_t i = 0; i < l.size(); ++i)
      for (auto& x : ex.view(i)) x = std::uniform_real_distribution<float>(-1, 1)(rng) * float(1 + i % 3);
    for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);  // generation order: buckets go out as they complete
    auto st = ex.finish();
    CHECK(st.finite());
    auto ar = m.calls().of(mock::op::all_reduce);
    const bool norms_expected = gflow::detail::plan::csc_schedule{warmup, 0, percent}.selected(std::uint64_t(it) + 1, nc) < nc || sel.size() < nc;
    REQUIRE(ar.size() >= (norms_expected ? 1u : 0u));
    const std::size_t nchunk_ar = ar.size() - (norms_expected ? 1 : 0);
    std::size_t elems = 0, bytes = 0;
    for (std::size_t k = 0; k < nchunk_ar; ++k) {
      CHECK(ar[k].type == dtype_of_v<W>);
      CHECK_FALSE(ar[k].async);
      elems += ar[k].count;
      bytes += ar[k].bytes;
      if (threshold != 0 && k + 1 < nchunk_ar) CHECK(ar[k].bytes >= threshold);  // fused: only the last may be short
    }
    if (norms_expected) {
      CHECK(ar.back().type == dtype::f32);
      CHECK(ar.back().count == nc);
      bytes += ar.back().bytes;
    }
    const auto done = s.selected_chunks();
    CHECK(std::vector<std::uint32_t>(done.begin(), done.end()) == sel);
    CHECK(elems == s.geometry().elements(sel.begin(), sel.end()));  // partial last chunk counted as it is
    CHECK(st.wire_bytes == bytes);
    CHECK(s.wire_bytes() == elems * sizeof(W) + (norms_expected ? nc * 4 : 0));
    CHECK(s.collectives() == ar.size());
    if (threshold == 0) {
      // Without Fusion: one allreduce per bucket that completed at least one selected chunk.
      const auto mask = mask_of(sel, nc);
      std::size_t buckets_with_selected = 0;
      for (const auto& r : ranges) {
        bool any = false;
        for (std::size_t c = r.first; c < r.end; ++c) any = any || mask[c];
        buckets_with_selected += any;
      }
      CHECK(nchunk_ar == buckets_with_selected);
    }
  }
}
}  // namespace

TEST_CASE("CSC on the mock: one norm allreduce per sparse iteration, chunk allreduces total the selected chunks") {
  // 68 elements, chunks of 8: 9 chunks, the last with 4 elements.
  auto l = Layout::from_sizes({10, 20, 5, 30, 3});
  SUBCASE("fp32, no Fusion, warm-up 2") { check_wire<Exchanger<Sparsifier<CSC<8, 25>>>>(l, 2, 12, 25); }
  SUBCASE("fp16, no Fusion, warm-up 0") { check_wire<Exchanger<Precision<half>, Sparsifier<CSC<8, 25>>>>(l, 0, 12, 40); }
  SUBCASE("fp16, Fusion 40 B") { check_wire<Exchanger<Fusion<40>, Precision<half>, Sparsifier<CSC<8, 25>>>>(l, 1, 12, 60); }
  SUBCASE("fp32, Fusion larger than the pool: one chunk allreduce at the end") {
    check_wire<Exchanger<Fusion<1 << 20>, Sparsifier<CSC<8, 25>>>>(l, 3, 10, 25);
  }
  SUBCASE("bf16, chunk larger than the pool: one chunk, never sparse, no norm collective") {
    check_wire<Exchanger<Precision<bfloat16>, Sparsifier<CSC<1000, 10>>>>(l, 0, 5, 10);
  }
  SUBCASE("chunk of one element") { check_wire<Exchanger<Sparsifier<CSC<1, 5>>, Fusion<64>>>(l, 1, 8, 5); }
}

TEST_CASE("CSC on the mock: dense warm-up iterations issue no norm collective") {
  auto l = Layout::from_sizes({64, 64});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<16, 50>>>> ex(m, l);
  ex.sparsifier().set_warmup(3, 0);
  std::vector<std::size_t> per_iter;
  for (int it = 0; it < 5; ++it) {
    m.calls().clear();
    ex.ready(0);
    ex.ready(1);
    (void)ex.finish();
    per_iter.push_back(m.calls().of(mock::op::all_reduce).size());
  }
  // iterations 0, 1: dense, 2 buckets each; 2: dense + norms for iteration 3; 3, 4: sparse + norms
  CHECK(per_iter[0] == 2);
  CHECK(per_iter[1] == 2);
  CHECK(per_iter[2] == 3);
  CHECK(ex.sparsifier().selected_chunks().size() == 4);
  CHECK(ex.sparsifier().upcoming_chunks().size() == 4);
}

// ---- bad input -----------------------------------------------------------------------------------

TEST_CASE("CSC setters reject bad values with typed errors naming the parameter, and refuse mid-iteration changes") {
  auto l = Layout::from_sizes({30, 30});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> ex(m, l);
  auto& s = ex.sparsifier();
  auto expect = [](auto&& f, const char* subject, const char* text) {
    try {
      f();
      FAIL("expected an error");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == subject);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
      CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
    }
  };
  expect([&] { s.set_percent(0); }, "percent", "must lie in (0, 100] (got 0)");
  expect([&] { s.set_percent(101); }, "percent", "must lie in (0, 100] (got 101)");
  expect([&] { s.set_momentum(-0.1f); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_momentum(1.5f); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_momentum(std::nanf("")); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_warmup(0, (std::uint64_t{1} << 32) + 1); }, "ramp", "longer than supported");
  CHECK(s.percent() == 15);
  CHECK(s.momentum() == doctest::Approx(1.0f));  // default: nothing lost
  CHECK(s.warmup_iterations() == 100);
  s.set_percent(100);
  s.set_momentum(0.0f);
  s.set_warmup(0, 0);
  CHECK(s.percent() == 100);
  ex.ready(1);  // pool bucket 0 goes out: the iteration has started
  CHECK_THROWS_AS(s.set_percent(20), gflow::usage_error);
  CHECK_THROWS_AS(s.set_momentum(0.5f), gflow::usage_error);
  CHECK_THROWS_AS(ex.set_fusion(64), gflow::usage_error);
  ex.ready(0);
  (void)ex.finish();
  s.set_percent(20);  // fine again between iterations
  ex.set_fusion(64);  // re-plans the chunk ranges
  for (int it = 0; it < 3; ++it) {
    ex.ready(0);
    ex.ready(1);
    (void)ex.finish();
  }
  CHECK(s.selected_chunks().size() == 2);  // ceil(20% of 8)
}
