// Re-sharding checkpoints (support/reshard.hpp, reshard.hpp): P checkpoints loaded by a job of
// P' ranks. P' = P is the identity byte for byte (every built-in composition, so the section
// parser matches what each engine writes); P' != P conserves every residual element
// (sum over ranks / ranks, bitwise on dyadic values; the plain sum with average off), carries the
// iteration, schedules and selections over, and the next iterations apply exactly the pending
// update; OkTopK's estimates are reset on another size and re-estimated in the first iteration;
// every bad set is a typed error before anything is applied.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/reshard.hpp>
#include <gflow/transport/inproc.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "checkpoint_streams.hpp"
#include "compositions.hpp"

using namespace gflow;
using gflow_test::streams;
using gflow_test::on_inproc;

namespace {

const Layout& rs_layout() {
  static const Layout l = Layout::from_sizes({300, 17, 1024, 5, 999, 64});
  return l;
}

/// Dyadic gradients: multiples of 1/64 in [-1/2, 1/2), so sums over a few ranks, their halves and
/// quarters (and * 3/4) are exact in float.
float dyadic(int rank, std::size_t i, std::size_t j, int it) {
  const std::uint64_t h = (std::uint64_t(rank) * 7919u + i * 104729u + j * 31u + std::uint64_t(it) * 613u) % 64u;
  return (static_cast<float>(h) - 32.0f) / 64.0f * static_cast<float>(1 + rank % 3);  // magnitudes differ by rank (so do OkTopK's local thresholds)
}

template <class X>
void step(X& ex, int rank, int it, bool zero = false) {
  const Layout& l = ex.layout();
  for (std::size_t i = 0; i < l.size(); ++i) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = zero ? 0.0f : dyadic(rank, i, j, it);
  }
  for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);
  (void)ex.finish();
}

template <class X>
std::vector<float> residual_of(const X& ex) {
  auto r = ex.sparsifier().residual();
  return {r.begin(), r.end()};
}

/// P ranks run k iterations (configure first), each saves; returns the P checkpoints.
template <class E>
std::vector<std::string> saved_set(int P, int k, const std::function<void(on_inproc<E>&)>& configure, exchange_options opt = {}) {
  std::vector<std::string> files(static_cast<std::size_t>(P));
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout(), opt);
    configure(ex);
    for (int it = 0; it < k; ++it) step(ex, t.rank(), it);
    std::ostringstream os(std::ios::binary);
    ex.save_state(os);
    files[std::size_t(t.rank())] = os.str();
  });
  return files;
}

/// The residual of each old checkpoint (loaded back on its own rank).
template <class E>
std::vector<std::vector<float>> residuals_of_set(const std::vector<std::string>& files, exchange_options opt = {}) {
  const int P = static_cast<int>(files.size());
  std::vector<std::vector<float>> out(files.size());
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout(), opt);
    std::istringstream in(files[std::size_t(t.rank())], std::ios::binary);
    ex.load_state(in);
    out[std::size_t(t.rank())] = residual_of(ex);
  });
  return out;
}

std::vector<double> sum_over_ranks(const std::vector<std::vector<float>>& r) {
  std::vector<double> s(r.at(0).size(), 0.0);
  for (const auto& v : r)
    for (std::size_t i = 0; i < v.size(); ++i) s[i] += v[i];
  return s;
}

/// Loads `files` re-sharded on P2 ranks; returns each new rank's residual and its iteration.
template <class E>
std::vector<std::vector<float>> load_on(int P2, const std::vector<std::string>& files, std::uint64_t expect_iteration, exchange_options opt = {}) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(P2));
  inproc::run(P2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout(), opt);
    streams s(files);
    load_resharded(ex, s.span());
    CHECK(ex.iteration() == expect_iteration);
    out[std::size_t(t.rank())] = residual_of(ex);
  });
  return out;
}

template <class E>
void check_conservation(int P, int k, const std::function<void(on_inproc<E>&)>& configure) {
  for (bool average : {true, false}) {
    exchange_options opt;
    opt.average = average;
    const auto files = saved_set<E>(P, k, configure, opt);
    const auto before = sum_over_ranks(residuals_of_set<E>(files, opt));
    bool nonzero = false;
    for (double v : before) nonzero = nonzero || v != 0.0;
    REQUIRE(nonzero);  // the test means something only with residual held
    for (int P2 : {1, 2, 3, P + 2}) {
      CAPTURE(average);
      CAPTURE(P2);
      const auto after_r = load_on<E>(P2, files, std::uint64_t(k), opt);
      const auto after = sum_over_ranks(after_r);
      REQUIRE(after.size() == before.size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < after.size(); ++i)
        // average: sum'/P' == sum/P (as P * sum' == P' * sum, exact on these values); sum: equal.
        if (average ? after[i] * P != before[i] * P2 : after[i] != before[i]) ++bad;
      CHECK(bad == 0);
      for (int q = P; q < P2; ++q)  // new ranks past the old count start with nothing held
        for (float v : after_r[std::size_t(q)]) REQUIRE(v == 0.0f);
    }
  }
}

}  // namespace

// ---- P' = P: the identity, byte for byte (the parser reads what every engine writes) ------------

namespace {
/// OkTopK parameters other than the defaults (so that carrying them over shows), with periods
/// that make iterations 5 and 6 neither threshold nor boundary iterations.
detail::oktopk_params oktopk_test_params() {
  detail::oktopk_params p;
  p.threshold_period = 16;
  p.boundary_period = 24;
  p.local_adapt = 1.02;
  p.capacity = 3.0;
  return p;
}
}  // namespace

template <class E>
void check_identity(int P, int k, const std::function<void(on_inproc<E>&)>& configure, exchange_options opt = {}) {
  const auto files = saved_set<E>(P, k, configure, opt);
  streams s(files);
  const auto out = reshard_checkpoints(s.span(), P, {opt.average});
  REQUIRE(out.size() == files.size());
  for (std::size_t r = 0; r < files.size(); ++r) CHECK(out[r] == files[r]);
}

TEST_CASE("reshard: P' = P rewrites every built-in composition's checkpoints byte for byte") {
  auto none = [](auto&) {};
  check_identity<Exchanger<Fusion<1024>>>(3, 2, none);
  check_identity<Exchanger<Precision<half>, Fusion<1024>, Sparsifier<CSC<64, 20>>>>(3, 5, [](auto& ex) { ex.sparsifier().set_warmup(1, 2); });
  check_identity<Exchanger<Sparsifier<CSC<64, 20>>, Topology<Hybrid<4096, 2>>>>(4, 3, [](auto& ex) { ex.sparsifier().set_warmup(0, 0); });
  check_identity<Exchanger<Sparsifier<TopK<0.01>>>>(3, 4,
                                                    [](auto& ex) { ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{2, 0.5}}, 0.05)); });
  check_identity<Exchanger<Fusion<2048>, Sparsifier<GTopK<0.01>>>>(4, 3, none);
  check_identity<Exchanger<Fusion<Auto>, Sparsifier<TopK<0.05>>>>(2, 3, none);
  exchange_options learn;
  learn.learn_order = true;
  check_identity<Exchanger<Fusion<2048>>>(2, 3, none, learn);
  check_identity<Exchanger<Sparsifier<OkTopK<0.05>>>>(4, 5, none);  // each rank keeps its own local thresholds
  check_identity<Exchanger<Fusion<2048>, Sparsifier<OkTopK<0.05>>>>(3, 5, [](auto& ex) { ex.sparsifier().set_params(oktopk_test_params()); });
  check_identity<Exchanger<Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>>>(4, 5, none);  // one selection unit per bucket
}

// ---- P' != P: conservation --------------------------------------------------------------------

TEST_CASE("reshard: TopK and GTopK residuals are conserved element by element onto 1, 2, 3 and 6 ranks from 4") {
  check_conservation<Exchanger<Sparsifier<TopK<0.05>>>>(4, 3, [](auto&) {});
  check_conservation<Exchanger<Fusion<2048>, Sparsifier<GTopK<0.05>>>>(4, 3, [](auto&) {});
}

TEST_CASE("reshard: OkTopK residuals (sharded too) are conserved element by element onto 1, 2, 3 and 6 ranks from 4") {
  auto configure = [](auto& ex) { ex.sparsifier().set_params(oktopk_test_params()); };
  check_conservation<Exchanger<Sparsifier<OkTopK<0.05>>>>(4, 5, configure);
  check_conservation<Exchanger<Fusion<2048>, Sparsifier<OkTopK<0.05>>>>(4, 5, configure);
  check_conservation<Exchanger<Fusion<2048>, Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>>>(4, 5, configure);
  check_conservation<Exchanger<Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>>>(4, 5, configure);
}

TEST_CASE("reshard: OkTopK carries its parameters; on another size its estimates are reset and re-estimated in the first iteration") {
  using E = Exchanger<Fusion<2048>, Sparsifier<OkTopK<0.05>>>;
  auto configure = [](auto& ex) { ex.sparsifier().set_params(oktopk_test_params()); };
  const int P = 4, k = 5;
  const auto files = saved_set<E>(P, k, configure);
  // The saved job has estimates, and its local thresholds differ between ranks (they are each
  // rank's own: the set is accepted all the same).
  std::vector<std::vector<float>> local0(P);  // per rank, every unit's local threshold
  std::size_t units = 0;
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    std::istringstream in(files[std::size_t(t.rank())], std::ios::binary);
    ex.load_state(in);
    if (t.rank() == 0) units = ex.sparsifier().units();
    for (std::size_t u = 0; u < ex.sparsifier().units(); ++u) {
      CHECK(ex.sparsifier().unit(u).local_thr >= 0.0f);
      CHECK(ex.sparsifier().unit(u).global_thr >= 0.0f);
      CHECK(ex.sparsifier().unit(u).bounds.size() == std::size_t(P) + 1);
    }
    for (std::size_t u = 0; u < ex.sparsifier().units(); ++u) local0[std::size_t(t.rank())].push_back(ex.sparsifier().unit(u).local_thr);
  });
  REQUIRE(units > 1);
  CHECK((local0[0] != local0[1] || local0[0] != local0[2] || local0[0] != local0[3]));
  // The uninterrupted job's next iteration (k), for the same-size check.
  std::vector<std::vector<float>> straight(P);
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    configure(ex);
    for (int it = 0; it <= k; ++it) step(ex, t.rank(), it);
    straight[std::size_t(t.rank())].assign(ex.pool_data(), ex.pool_data() + ex.pool_size());
    const auto r = residual_of(ex);
    straight[std::size_t(t.rank())].insert(straight[std::size_t(t.rank())].end(), r.begin(), r.end());
  });
  for (int P2 : {3, 5, 2, P}) {
    CAPTURE(P2);
    inproc::run(P2, [&](inproc::transport& t) {
      on_inproc<E> ex(t, rs_layout());  // default parameters: the set brings the saved ones
      streams s(files);
      load_resharded(ex, s.span());
      auto& sp = ex.sparsifier();
      CHECK(ex.iteration() == std::uint64_t(k));
      CHECK(sp.params().threshold_period == 16);
      CHECK(sp.params().boundary_period == 24);
      CHECK(sp.params().local_adapt == 1.02);
      CHECK(sp.params().capacity == 3.0);
      REQUIRE(sp.units() == units);
      for (std::size_t u = 0; u < units; ++u) {
        if (P2 == P) {
          CHECK(sp.unit(u).bounds.size() == std::size_t(P) + 1);
        } else {
          CHECK(sp.unit(u).local_thr == -1.0f);
          CHECK(sp.unit(u).global_thr == -1.0f);
          CHECK(sp.unit(u).bounds.empty());
        }
      }
      step(ex, t.rank(), k);
      const auto r1 = sp.reestimated();
      if (P2 == P) {  // the estimates were kept: iteration k is neither a threshold nor a boundary iteration
        CHECK(r1.boundary == 0);
        CHECK(r1.global == 0);
        std::vector<float> got(ex.pool_data(), ex.pool_data() + ex.pool_size());
        const auto r = residual_of(ex);
        got.insert(got.end(), r.begin(), r.end());
        const auto& want = straight[std::size_t(t.rank())];
        REQUIRE(got.size() == want.size());
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);  // bitwise the uninterrupted run
      } else {  // as on first use: every unit's exact local top-k, boundaries, full-range global cut
        CHECK(r1.local == units);
        CHECK(r1.boundary == units);
        CHECK(r1.global == units);
        for (std::size_t u = 0; u < units; ++u) {
          CHECK(sp.unit(u).bounds.size() == std::size_t(P2) + 1);
          CHECK(sp.unit(u).global_thr >= 0.0f);
        }
        step(ex, t.rank(), k + 1);
        CHECK(sp.reestimated().boundary == 0);  // estimated once, then kept until their period
        CHECK(sp.reestimated().global == 0);
      }
    });
  }
}

TEST_CASE("reshard: CSC history is conserved; settings, selection and norms carry over") {
  using E = Exchanger<Sparsifier<CSC<64, 20>>>;
  auto configure = [](auto& ex) {
    ex.sparsifier().set_warmup(1, 2);
    ex.sparsifier().set_momentum(0.5f);
  };
  check_conservation<E>(4, 5, configure);
  const auto files = saved_set<E>(4, 5, configure);
  {
    // rank 0's own load on a 4-rank job gives the reference selection and norms
    std::vector<std::uint32_t> ref;
    std::vector<float> ref_norms;
    inproc::run(4, [&](inproc::transport& t) {
      on_inproc<E> ex(t, rs_layout());
      std::istringstream in(files[std::size_t(t.rank())], std::ios::binary);
      ex.load_state(in);
      if (t.rank() == 0) {
        ref.assign(ex.sparsifier().upcoming_chunks().begin(), ex.sparsifier().upcoming_chunks().end());
        ref_norms.assign(ex.sparsifier().norms().begin(), ex.sparsifier().norms().end());
      }
    });
    inproc::run(3, [&](inproc::transport& t) {
      on_inproc<E> ex(t, rs_layout());
      streams s(files);
      load_resharded(ex, s.span());
      auto& sp = ex.sparsifier();
      CHECK(sp.momentum() == 0.5f);
      CHECK(sp.warmup_iterations() == 1);
      CHECK(sp.ramp_iterations() == 2);
      CHECK(std::vector<std::uint32_t>(sp.upcoming_chunks().begin(), sp.upcoming_chunks().end()) == ref);
      CHECK(std::memcmp(sp.norms().data(), ref_norms.data(), ref_norms.size() * sizeof(float)) == 0);
      CHECK(sp.upcoming_chunks().size() < sp.chunk_count());
    });
  }
}

TEST_CASE("reshard: after 4 -> 2, iterations with zero gradients apply exactly the pending update sum / P") {
  using E = Exchanger<Sparsifier<TopK<0.25>>>;
  const auto files = saved_set<E>(4, 3, [](auto&) {});
  const auto before = sum_over_ranks(residuals_of_set<E>(files));
  std::vector<double> applied(before.size(), 0.0);
  std::vector<std::vector<float>> left(2);
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    streams s(files);
    load_resharded(ex, s.span());
    for (int it = 0; it < 6; ++it) {
      step(ex, t.rank(), 100 + it, /*zero=*/true);
      if (t.rank() == 0)
        for (std::size_t i = 0; i < applied.size(); ++i) applied[i] += ex.pool_data()[i];
    }
    left[std::size_t(t.rank())] = residual_of(ex);
  });
  const auto still = sum_over_ranks(left);
  std::size_t bad = 0, moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (applied[i] != 0.0) ++moved;
    if (applied[i] + still[i] / 2 != before[i] / 4) ++bad;  // what the old job would have applied, exactly
  }
  CHECK(moved > 0);
  CHECK(bad == 0);
}

TEST_CASE("reshard: the tuner settles again after a change of size and keeps its state at the same size") {
  using E = Exchanger<Fusion<Auto>, Sparsifier<TopK<0.05>>>;
  const auto files = saved_set<E>(4, 40, [](auto&) {});
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    streams s(files);
    load_resharded(ex, s.span());
    CHECK(ex.tuner().state() == detail::fusion_tuner::phase::probe);
    CHECK(ex.tuner().iterations_in_phase() == 0);
    CHECK(ex.tuner().fitted().alpha == 0.0);
    CHECK(ex.tuner().fitted().beta == 0.0);
  });
}

// ---- bad sets: a typed error, nothing applied ---------------------------------------------------

namespace {
template <class E, class Err>
void check_refused(const std::vector<std::string>& files, const std::string& subject, int P2 = 2) {
  inproc::run(P2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    step(ex, t.rank(), 0);
    std::ostringstream before(std::ios::binary);
    ex.save_state(before);
    streams s(files);
    bool thrown = false;
    try {
      load_resharded(ex, s.span());
    } catch (const Err& e) {
      thrown = true;
      CHECK(e.subject() == subject);
    }
    CHECK(thrown);
    std::ostringstream after(std::ios::binary);
    ex.save_state(after);
    CHECK(after.str() == before.str());  // unchanged, byte for byte
  });
}
}  // namespace

TEST_CASE("reshard: truncated, corrupt, mixed, missing, duplicate and foreign sets are refused before anything is applied") {
  using E = Exchanger<Sparsifier<TopK<0.05>>>;
  const auto files = saved_set<E>(3, 2, [](auto&) {});
  const auto later = saved_set<E>(3, 3, [](auto&) {});
  SUBCASE("truncated") {
    auto f = files;
    f[1].resize(f[1].size() / 2);
    check_refused<E, parse_error>(f, "checkpoints");
  }
  SUBCASE("corrupt") {
    auto f = files;
    f[2][f[2].size() / 2] ^= 0x10;
    check_refused<E, parse_error>(f, "checkpoints");
  }
  SUBCASE("mixed generations") {
    auto f = files;
    f[1] = later[1];
    check_refused<E, mismatch_error>(f, "iteration");
  }
  SUBCASE("missing rank") {
    check_refused<E, invalid_argument>({files[0], files[2]}, "checkpoints");
  }
  SUBCASE("duplicate rank") {
    check_refused<E, invalid_argument>({files[0], files[1], files[1]}, "checkpoints");
  }
  SUBCASE("duplicate rank standing in for a missing one") {
    check_refused<E, invalid_argument>({files[0], files[1], files[1], files[2]}, "checkpoints");
  }
  SUBCASE("no checkpoint") {
    check_refused<E, invalid_argument>({}, "checkpoints");
  }
  SUBCASE("another composition") {
    const auto csc = saved_set<Exchanger<Sparsifier<CSC<64, 20>>>>(3, 2, [](auto&) {});
    check_refused<E, mismatch_error>(csc, "composition");
  }
  SUBCASE("shared state differs (R1)") {
    const auto other = saved_set<E>(3, 2, [](auto& ex) { ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{1, 0.5}}, 0.05)); });
    check_refused<E, mismatch_error>({files[0], other[1], files[2]}, "checkpoints");
    streams s({files[0], other[1], files[2]});
    std::ostringstream out;
    try {
      reshard_checkpoint(s.span(), 0, 2, out);
      FAIL("no error");
    } catch (const mismatch_error& e) {
      CHECK(std::string(e.what()).find("the state every rank holds alike (section SPRS) differs between rank 0 and rank 1 at iteration 2.") !=
            std::string::npos);
      CHECK(std::string(e.what()).find("Fix: pass checkpoints saved by one job at one iteration, unmodified.") != std::string::npos);
    }
  }
  SUBCASE("a set from two jobs") {
    const auto two = saved_set<E>(2, 2, [](auto&) {});
    check_refused<E, invalid_argument>({files[0], files[1], two[1]}, "checkpoints");
  }
}

TEST_CASE("reshard: OkTopK sets with differing parameters or invalid estimates are refused before anything is applied") {
  using E = Exchanger<Sparsifier<OkTopK<0.05>>>;  // one selection unit: the tail is at a known place
  const int P = 3;
  const auto files = saved_set<E>(P, 5, [](auto&) {});
  // The end of an OkTopK (unfused) checkpoint: ..., f32 local, f32 global, u64 P + 1, (P + 1) x u64
  // boundaries, u64 checksum (the hash of every byte before it).
  const std::size_t tail = 8 + 8 * (P + 1) + 8 + 4 + 4;
  auto rewrite = [&](std::string f, std::size_t from_end, auto v) {  // v's bytes (f32 or f64) there, the checksum recomputed
    std::memcpy(f.data() + f.size() - from_end, &v, sizeof v);
    detail::stream_hash h;
    h.update(f.data(), f.size() - 8);
    const std::uint64_t c = h.value();
    for (int i = 0; i < 8; ++i) f[f.size() - 8 + std::size_t(i)] = static_cast<char>((c >> (8 * i)) & 0xffu);
    return f;
  };
  SUBCASE("the rewrite itself leaves a valid checkpoint (a local threshold is each rank's own)") {
    auto f = files;
    f[1] = rewrite(f[1], tail, 0.25f);
    streams s(f);
    CHECK_NOTHROW((void)reshard_checkpoints(s.span(), 2));
  }
  SUBCASE("a global threshold differs between ranks: R1") {
    auto f = files;
    f[1] = rewrite(f[1], tail - 4, 0.25f);
    check_refused<E, mismatch_error>(f, "checkpoints");
  }
  SUBCASE("a threshold that is not a magnitude: E74") {
    auto f = files;
    f[2] = rewrite(f[2], tail, -2.0f);
    check_refused<E, parse_error>(f, "checkpoints");
    streams s(f);
    try {
      (void)reshard_checkpoints(s.span(), 2);
      FAIL("no error");
    } catch (const parse_error& e) {
      CHECK(std::string(e.what()).find("checkpoint 2 of the set cannot be read") != std::string::npos);
      CHECK(std::string(e.what()).find("unit 0 has threshold -2.000000") != std::string::npos);
    }
  }
  SUBCASE("other parameters: R1") {
    const auto other = saved_set<E>(P, 5, [](auto& ex) { ex.sparsifier().set_params(oktopk_test_params()); });
    check_refused<E, mismatch_error>({files[0], other[1], files[2]}, "checkpoints");
  }
  // Before the unit count (u64) and the unit's tail: f64 local_adapt, capacity.
  // Parameters set alike on every rank but outside what set_params accepts: the re-sharder refuses
  // the set (nothing written), naming the parameter, as the engine would refuse it on load.
  const std::size_t capacity_at = tail + 8 + 8, local_adapt_at = capacity_at + 8;
  SUBCASE("parameters out of range") {
    for (const auto& [at, v, name] : {std::tuple{capacity_at, 100.0, "capacity"},
                                      std::tuple{local_adapt_at, std::numeric_limits<double>::quiet_NaN(), "local_adapt"}}) {
      CAPTURE(name);
      auto f = files;
      for (auto& x : f) x = rewrite(x, at, v);
      streams s(f);
      try {
        (void)reshard_checkpoints(s.span(), 2);
        FAIL("no error");
      } catch (const parse_error& e) {
        const std::string what = e.what();
        CHECK(e.subject() == "checkpoints");  // the set; the message names the file and the parameter
        CHECK(what.find("checkpoint 0 of the set cannot be read") != std::string::npos);
        CHECK(what.find(std::string("parse error in '") + name + "': the checkpoint's OkTopK parameters are invalid") != std::string::npos);
        CHECK(what.find("pass e.g.") == std::string::npos);  // set_params' fix is not a checkpoint's
      }
      // the engine's own load (load_state, no re-sharding) refuses the same bytes by the same rule
      inproc::run(P, [&](inproc::transport& t) {
        on_inproc<E> ex(t, rs_layout());
        std::istringstream in(f[std::size_t(t.rank())], std::ios::binary);
        bool thrown = false;
        try {
          ex.load_state(in);
        } catch (const parse_error& e) {
          thrown = true;
          const std::string what = e.what();
          CHECK(e.subject() == name);
          CHECK(what.find("the checkpoint's OkTopK parameters are invalid") != std::string::npos);
          CHECK(what.find("pass e.g.") == std::string::npos);
        }
        CHECK(thrown);
      });
    }
  }
  SUBCASE("the offsets above are the parameters': the defaults read back") {
    double v = 0;
    std::memcpy(&v, files[0].data() + files[0].size() - capacity_at, sizeof v);
    CHECK(v == detail::oktopk_params{}.capacity);
    std::memcpy(&v, files[0].data() + files[0].size() - local_adapt_at, sizeof v);
    CHECK(v == detail::oktopk_params{}.local_adapt);
  }
}

TEST_CASE("reshard: a bad new rank or size is refused") {
  using E = Exchanger<Sparsifier<TopK<0.05>>>;
  const auto files = saved_set<E>(2, 1, [](auto&) {});
  streams s(files);
  std::ostringstream out;
  CHECK_THROWS_AS(reshard_checkpoint(s.span(), 2, 2, out), invalid_argument);
  CHECK_THROWS_AS(reshard_checkpoint(s.span(), 0, 0, out), invalid_argument);
  CHECK(out.str().empty());
}

// ---- files: atomic writes, the newest complete set, automatic re-sharding -----------------------

TEST_CASE("reshard: save_checkpoint writes atomically; load_checkpoint takes the newest complete set and re-shards") {
  using E = Exchanger<Sparsifier<TopK<0.05>>>;
  const std::filesystem::path root = std::filesystem::temp_directory_path() / ("gflow_reshard_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::vector<std::vector<float>> old(4);
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    for (int it = 0; it < 4; ++it) {
      step(ex, t.rank(), it);
      if (it % 2 == 1) (void)save_checkpoint(ex, root);
    }
    old[std::size_t(t.rank())] = residual_of(ex);
  });
  // A rank that died while writing the next set: only rank 0's file of iteration 6 exists.
  std::filesystem::create_directories(checkpoint_set_dir(root, 6));
  std::filesystem::copy_file(checkpoint_file(checkpoint_set_dir(root, 4), 0), checkpoint_file(checkpoint_set_dir(root, 6), 0));
  std::size_t tmp = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.path().extension() == ".tmp") ++tmp;
  CHECK(tmp == 0);
  const auto set = newest_checkpoint_set(root);
  REQUIRE(set.size() == 4);
  CHECK(set[0].parent_path() == checkpoint_set_dir(root, 4));
  std::vector<std::vector<float>> now(2);
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    CHECK(load_checkpoint(ex, root) == 4);
    now[std::size_t(t.rank())] = residual_of(ex);
  });
  const auto a = sum_over_ranks(old), b = sum_over_ranks(now);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (b[i] * 4 != a[i] * 2) ++bad;
  CHECK(bad == 0);
  inproc::run(4, [&](inproc::transport& t) {  // same size: each rank its own file, bitwise
    on_inproc<E> ex(t, rs_layout());
    CHECK(load_checkpoint(ex, root) == 4);
    const auto r = residual_of(ex);
    CHECK(std::memcmp(r.data(), old[std::size_t(t.rank())].data(), r.size() * sizeof(float)) == 0);
  });
  std::filesystem::remove_all(root);
  inproc::run(1, [&](inproc::transport& t) {
    on_inproc<E> ex(t, rs_layout());
    CHECK_THROWS_AS(load_checkpoint(ex, root), invalid_argument);
  });
}

// ---- the gflow-reshard tool ----------------------------------------------------------------------

#ifdef GFLOW_RESHARD_EXE
template <class E>
void check_tool(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gflow_reshard_tool_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  const auto files = saved_set<E>(4, 3, [](auto&) {});
  std::string args;
  for (int r = 3; r >= 0; --r) {  // any order
    std::ofstream(checkpoint_file(dir / "in", r), std::ios::binary) << files[std::size_t(r)];
    args += " " + checkpoint_file(dir / "in", r).string();
  }
  const std::string exe = GFLOW_RESHARD_EXE;
  REQUIRE(std::system((exe + " --size 3 --out " + (dir / "out").string() + args + " > /dev/null").c_str()) == 0);
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> a(t, rs_layout()), b(t, rs_layout());
    std::ifstream in(checkpoint_file(dir / "out", t.rank()), std::ios::binary);
    a.load_state(in);
    streams s(files);
    load_resharded(b, s.span());
    std::ostringstream sa(std::ios::binary), sb(std::ios::binary);
    a.save_state(sa);
    b.save_state(sb);
    CHECK(sa.str() == sb.str());
  });
  CHECK_FALSE(fs::exists(checkpoint_file(dir / "out", 3)));
  // Bad sets: exit status 1, the error printed, nothing written.
  const std::string bad_out = (dir / "bad").string();
  CHECK(std::system((exe + " --size 2 --out " + bad_out + " " + checkpoint_file(dir / "in", 0).string() + " " +
                     checkpoint_file(dir / "in", 2).string() + " 2> " + (dir / "err.txt").string())
                        .c_str()) == 256);
  std::ifstream err(dir / "err.txt");
  const std::string msg((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  CHECK(msg.find("is missing") != std::string::npos);
  CHECK_FALSE(fs::exists(bad_out));
  CHECK(std::system((exe + " --out " + bad_out + args + " 2> /dev/null").c_str()) == 512);  // usage: no --size
  fs::remove_all(dir);
}

TEST_CASE("reshard: gflow-reshard rewrites 4 files into 3 that load_state takes as load_resharded's; a bad set writes nothing") {
  check_tool<Exchanger<Fusion<2048>, Sparsifier<GTopK<0.05>>>>("gtopk");
  check_tool<Exchanger<Fusion<2048>, Sparsifier<OkTopK<0.05>>>>("oktopk");
}
#endif
