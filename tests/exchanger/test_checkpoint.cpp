// Checkpoints (Exchanger::save_state / load_state, support/checkpoint.hpp): a run resumed from a
// checkpoint produces bitwise the gradients of an uninterrupted one, for every sparsifier, P = 1..4,
// fp32 and fp16 wires, with the run-time settings (CSC warm-up and momentum, Top-k density
// schedules, fusion and Hybrid thresholds) restored by the load alone; and every bad load
// (another rank, size, layout or composition; truncated, corrupt, foreign; mid-iteration) is a
// typed error that leaves the exchanger as it was.
#include <doctest/doctest.h>

#include <gflow/detail/support/checkpoint.hpp>
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "compositions.hpp"
#include "test_values.hpp"

using namespace gflow;
using gflow_test::on_inproc;

namespace {

const Layout& test_layout() {
  static const Layout l = Layout::from_sizes({300, 17, 1024, 5, 999, 64});
  return l;
}

/// One iteration: deterministic gradients of (rank, tensor, element, iteration), ready() in
/// reverse (generation) order.
template <class X>
exchange_status step(X& ex, int rank, int it) {
  const Layout& l = ex.layout();
  for (std::size_t i = 0; i < l.size(); ++i) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = gflow_test::uniform_value(rank, i, j, it) * float(1 + i % 3);
  }
  for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);
  return ex.finish();
}

template <class X>
std::vector<float> pool_copy(X& ex) {
  return {ex.pool_data(), ex.pool_data() + ex.pool_size()};
}

template <class X>
std::vector<float> residual_copy(const X& ex) {
  if constexpr (requires { ex.sparsifier().residual(); }) {
    auto r = ex.sparsifier().residual();
    return {r.begin(), r.end()};
  } else {
    return {};
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct record {
  std::vector<std::vector<float>> views;  // iterations k..N-1
  std::vector<exchange_status> status;
  std::vector<float> residual;            // after the last iteration
};

/// Runs E on P in-process ranks N iterations straight, and k iterations, save, destroy, a new
/// plain exchanger, load, N - k iterations; returns both records per rank.
template <class E>
void check_resume(int P, int N, int k, const std::function<void(on_inproc<E>&)>& configure) {
  std::vector<record> straight(static_cast<std::size_t>(P)), resumed(static_cast<std::size_t>(P));
  inproc::run(P, [&](inproc::transport& t) {
    const int r = t.rank();
    auto& a = straight[std::size_t(r)];
    {
      on_inproc<E> ex(t, test_layout());
      configure(ex);
      for (int it = 0; it < N; ++it) {
        const auto st = step(ex, r, it);
        if (it >= k) {
          a.views.push_back(pool_copy(ex));
          a.status.push_back(st);
        }
      }
      a.residual = residual_copy(ex);
    }
    std::stringstream file;
    {
      on_inproc<E> ex(t, test_layout());
      configure(ex);
      for (int it = 0; it < k; ++it) (void)step(ex, r, it);
      ex.save_state(file);
    }  // destroyed: only the checkpoint carries the state on
    auto& b = resumed[std::size_t(r)];
    on_inproc<E> ex(t, test_layout());  // not configured: the load restores the settings
    ex.load_state(file);
    CHECK(ex.iteration() == std::uint64_t(k));
    for (int it = k; it < N; ++it) {
      const auto st = step(ex, r, it);
      b.views.push_back(pool_copy(ex));
      b.status.push_back(st);
    }
    b.residual = residual_copy(ex);
  });
  for (int q = 0; q < P; ++q) {
    CAPTURE(q);
    const auto& a = straight[std::size_t(q)];
    const auto& b = resumed[std::size_t(q)];
    REQUIRE(a.views.size() == b.views.size());
    for (std::size_t j = 0; j < a.views.size(); ++j) {
      CAPTURE(j);
      CHECK(same_bits(a.views[j], b.views[j]));
      CHECK(a.status[j].iteration == b.status[j].iteration);
      CHECK(a.status[j].nonfinite == b.status[j].nonfinite);
      CHECK(a.status[j].collectives == b.status[j].collectives);
      CHECK(a.status[j].wire_bytes == b.status[j].wire_bytes);
    }
    CHECK(same_bits(a.residual, b.residual));
  }
}

template <class E>
void resume_matrix(const std::function<void(on_inproc<E>&)>& configure, std::initializer_list<int> ks, int N = 10) {
  for (int P = 1; P <= 4; ++P)
    for (int k : ks) {
      CAPTURE(P);
      CAPTURE(k);
      check_resume<E>(P, N, k, configure);
    }
}

}  // namespace

// ---- bitwise resume ----------------------------------------------------------------------------

TEST_CASE_TEMPLATE("checkpoint: Dense resumes bitwise; the run-time fusion numbers come back with the load", W, float, half) {
  using E = Exchanger<Precision<W>, Fusion<1024>>;
  resume_matrix<E>([](auto& ex) { ex.set_fusion(8000, 300); }, {1, 4});
  // The restored buckets are the saved ones, not the policy's.
  inproc::run(1, [](inproc::transport& t) {
    on_inproc<E> a(t, test_layout());
    a.set_fusion(8000, 300);
    std::stringstream f;
    a.save_state(f);
    on_inproc<E> b(t, test_layout());
    REQUIRE(b.buckets().size() != a.buckets().size());
    b.load_state(f);
    CHECK(b.threshold_bytes() == 8000);
    REQUIRE(b.buckets().size() == a.buckets().size());
    for (std::size_t i = 0; i < a.buckets().size(); ++i) CHECK(b.buckets()[i].count == a.buckets()[i].count);
  });
}

TEST_CASE_TEMPLATE("checkpoint: CSC with warm-up, ramp and momentum resumes bitwise (saved in warm-up, ramp and after)", W, float, half) {
  auto configure = [](auto& ex) {
    ex.sparsifier().set_warmup(2, 3);  // dense 0-1, ramp 2-4, then 20%
    ex.sparsifier().set_momentum(0.9f);
  };
  resume_matrix<Exchanger<Precision<W>, Fusion<1024>, Sparsifier<CSC<64, 20>>>>(configure, {1, 3, 6});
  resume_matrix<Exchanger<Precision<W>, Sparsifier<CSC<64, 20>>>>(configure, {4});
  // The load brings the settings and the selection with it.
  inproc::run(2, [&](inproc::transport& t) {
    using E = Exchanger<Precision<W>, Sparsifier<CSC<64, 20>>>;
    on_inproc<E> a(t, test_layout());
    configure(a);
    for (int it = 0; it < 7; ++it) (void)step(a, t.rank(), it);
    std::stringstream f;
    a.save_state(f);
    on_inproc<E> b(t, test_layout());
    b.load_state(f);
    auto& sa = a.sparsifier();
    auto& sb = b.sparsifier();
    CHECK(sb.momentum() == 0.9f);
    CHECK(sb.warmup_iterations() == 2);
    CHECK(sb.ramp_iterations() == 3);
    CHECK(std::vector<std::uint32_t>(sb.upcoming_chunks().begin(), sb.upcoming_chunks().end()) ==
          std::vector<std::uint32_t>(sa.upcoming_chunks().begin(), sa.upcoming_chunks().end()));
    CHECK(std::vector<std::uint32_t>(sb.selected_chunks().begin(), sb.selected_chunks().end()) ==
          std::vector<std::uint32_t>(sa.selected_chunks().begin(), sa.selected_chunks().end()));
    CHECK(sa.upcoming_chunks().size() < sa.chunk_count());  // sparse by now: the selection matters
    CHECK(std::memcmp(sa.norms().data(), sb.norms().data(), sa.norms().size() * sizeof(float)) == 0);
  });
}

TEST_CASE_TEMPLATE("checkpoint: TopK and GTopK with a density schedule resume bitwise", W, float, half) {
  auto configure = [](auto& ex) { ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{2, 0.5}, {5, 0.2}}, 0.05)); };
  resume_matrix<Exchanger<Precision<W>, Sparsifier<TopK<0.01>>>>(configure, {1, 3, 6});
  resume_matrix<Exchanger<Precision<W>, Fusion<2048>, Sparsifier<GTopK<0.01>>>>(configure, {1, 3, 6});
  resume_matrix<Exchanger<Precision<W>, Fusion<2048>, Sparsifier<TopK<0.01>>>>(configure, {4});
  resume_matrix<Exchanger<Precision<W>, Sparsifier<GTopK<0.01>>>>(configure, {4});
  // A changed index width comes back too.
  inproc::run(1, [&](inproc::transport& t) {
    using E = Exchanger<Precision<W>, Sparsifier<GTopK<0.01>>>;
    on_inproc<E> a(t, test_layout());
    configure(a);
    a.sparsifier().set_index_bytes(8);
    std::stringstream f;
    a.save_state(f);
    on_inproc<E> b(t, test_layout());
    b.load_state(f);
    CHECK(b.sparsifier().index_bytes() == 8);
    CHECK(b.sparsifier().schedule() == a.sparsifier().schedule());
  });
}

TEST_CASE("checkpoint: a Hybrid threshold changed at run time comes back with the load") {
  using E = Exchanger<Fusion<1024>, Topology<Hybrid<(1 << 20), 1>>>;
  resume_matrix<E>([](auto& ex) { ex.topology().set_threshold(2048); }, {3}, 6);
  inproc::run(2, [](inproc::transport& t) {
    on_inproc<E> a(t, test_layout());
    a.topology().set_threshold(2048);
    std::stringstream f;
    a.save_state(f);
    on_inproc<E> b(t, test_layout());
    b.load_state(f);
    CHECK(b.topology().threshold() == 2048);
  });
}

TEST_CASE("checkpoint: the state sits anywhere in a larger stream; each rank's file is its own") {
  using E = Exchanger<Sparsifier<TopK<0.05>>>;
  inproc::run(3, [](inproc::transport& t) {
    on_inproc<E> a(t, test_layout());
    for (int it = 0; it < 3; ++it) (void)step(a, t.rank(), it);
    std::stringstream f;
    f << "model weights before";
    a.save_state(f);
    f << "and after";
    on_inproc<E> b(t, test_layout());
    std::string head(20, '\0');
    f.read(head.data(), 20);
    CHECK(head == "model weights before");
    b.load_state(f);
    std::string tail;
    f >> tail;
    CHECK(tail == "and");
    CHECK(same_bits(residual_copy(a), residual_copy(b)));
  });
}

// ---- errors ------------------------------------------------------------------------------------

namespace {
/// The state a failed load must leave untouched: all of it, as a save writes it (iteration, fusion
/// numbers, Hybrid threshold, density schedule, index width, CSC norms and history, residuals),
/// plus the pool, which a checkpoint does not hold. The named fields say what differed.
template <class X>
struct snapshot {
  std::uint64_t iteration;
  std::vector<float> residual;
  std::vector<std::uint32_t> upcoming;
  std::size_t threshold;
  std::vector<float> pool;
  std::string saved;  // save_state's bytes
  explicit snapshot(X& ex)
      : iteration(ex.iteration()), residual(residual_copy(ex)), threshold(ex.threshold_bytes()), pool(ex.pool_data(), ex.pool_data() + ex.pool_size()) {
    if constexpr (requires { ex.sparsifier().upcoming_chunks(); })
      upcoming.assign(ex.sparsifier().upcoming_chunks().begin(), ex.sparsifier().upcoming_chunks().end());
    std::ostringstream out;
    ex.save_state(out);
    saved = out.str();
  }
  bool operator==(const snapshot& o) const {
    return iteration == o.iteration && same_bits(residual, o.residual) && upcoming == o.upcoming && threshold == o.threshold &&
           same_bits(pool, o.pool) && saved == o.saved;
  }
};

template <class Err, class X>
std::string load_fails(X& ex, const std::string& bytes) {
  const snapshot<X> before(ex);
  std::istringstream in(bytes);
  std::string msg;
  try {
    ex.load_state(in);
    FAIL("load_state accepted a bad checkpoint");
  } catch (const Err& e) {
    msg = e.what();
  }
  CHECK(snapshot<X>(ex) == before);
  return msg;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("checkpoint errors: another rank's or another job size's checkpoint is a mismatch_error naming both") {
  using E = Exchanger<Sparsifier<CSC<64, 20>>>;
  std::vector<std::string> files(2);
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, test_layout());
    for (int it = 0; it < 3; ++it) (void)step(ex, t.rank(), it);
    std::ostringstream f;
    ex.save_state(f);
    files[std::size_t(t.rank())] = f.str();
    t.barrier();
    const std::string other = files[std::size_t(1 - t.rank())];
    const std::string msg = load_fails<mismatch_error>(ex, other);
    CHECK(contains(msg, "in 'rank'"));
    CHECK(contains(msg, "saved by rank " + std::to_string(1 - t.rank())));
    CHECK(contains(msg, "this exchanger is rank " + std::to_string(t.rank()) + " of 2"));
    CHECK(contains(msg, "Fix: let every rank load the checkpoint it saved itself"));
  });
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> ex(t, test_layout());
    (void)step(ex, t.rank(), 0);
    const std::string msg = load_fails<mismatch_error>(ex, files[std::size_t(t.rank() % 2)]);
    CHECK(contains(msg, "in 'size'"));
    CHECK(contains(msg, "a job of 2 ranks; this one has 3"));
  });
}

TEST_CASE("checkpoint errors: another layout names the first differing tensor; another composition names both") {
  std::string file;
  inproc::run(1, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<TopK<0.05>>>> ex(t, test_layout());
    (void)step(ex, 0, 0);
    std::ostringstream f;
    ex.save_state(f);
    file = f.str();
    {
      on_inproc<Exchanger<Sparsifier<TopK<0.05>>>> other(t, Layout::from_sizes({300, 17, 1000, 5, 999, 64}));
      const std::string msg = load_fails<mismatch_error>(other, file);
      CHECK(contains(msg, "in 'layout'"));
      CHECK(contains(msg, "the first tensor that differs is 2 ('t2' here"));
    }
    {
      on_inproc<Exchanger<Sparsifier<TopK<0.05>>>> fewer(t, Layout::from_sizes({300, 17, 1024, 5, 999}));
      const std::string msg = load_fails<mismatch_error>(fewer, file);
      CHECK(contains(msg, "a layout of 6 tensors; this exchanger's has 5"));
    }
    {
      on_inproc<Exchanger<Sparsifier<GTopK<0.05>>>> other(t, test_layout());
      const std::string msg = load_fails<mismatch_error>(other, file);
      CHECK(contains(msg, "in 'composition'"));
      CHECK(contains(msg, "TopK<"));
      CHECK(contains(msg, "GTopK<"));
    }
    {
      on_inproc<Exchanger<Precision<half>, Sparsifier<TopK<0.05>>>> other(t, test_layout());
      CHECK(contains(load_fails<mismatch_error>(other, file), "in 'composition'"));
    }
  });
}

TEST_CASE("checkpoint errors: every truncation and every flipped byte is a parse_error; the exchanger is unchanged") {
  // A small pool keeps the exhaustive flip loop short: every byte of the checkpoint is tried.
  const Layout small = Layout::from_sizes({10, 7, 3});
  auto check_all = [&](auto tag) {
    using E = decltype(tag);
    inproc::run(1, [&](inproc::transport& t) {
      on_inproc<E> ex(t, small);
      if constexpr (requires { ex.sparsifier().set_warmup(0, 0); }) ex.sparsifier().set_warmup(0, 0);
      for (int it = 0; it < 3; ++it) (void)step(ex, 0, it);
      std::ostringstream f;
      ex.save_state(f);
      const std::string good = f.str();
      CAPTURE(good.size());
      std::size_t truncations = 0, flips = 0;
      for (std::size_t cut = 0; cut < good.size(); ++cut) {
        const std::string msg = load_fails<parse_error>(ex, good.substr(0, cut));
        truncations += 1;
        CHECK(contains(msg, "truncated"));
      }
      for (std::size_t i = 0; i < good.size(); ++i)
        for (unsigned char bit : {0x01, 0x80}) {
          std::string bad = good;
          bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ bit);
          (void)load_fails<parse_error>(ex, bad);
          ++flips;
        }
      CHECK(truncations == good.size());
      CHECK(flips == 2 * good.size());
      // The intact checkpoint still loads after all that.
      std::istringstream in(good);
      ex.load_state(in);
      CHECK(ex.iteration() == 3);
    });
  };
  SUBCASE("Dense") { check_all(Exchanger<>{}); }
  SUBCASE("CSC") { check_all(Exchanger<Sparsifier<CSC<4, 50>>>{}); }
  SUBCASE("TopK") { check_all(Exchanger<Sparsifier<TopK<0.2>>>{}); }
  SUBCASE("GTopK") { check_all(Exchanger<Sparsifier<GTopK<0.2>>>{}); }
  // A TOPO section with state next to an SPRS section with state (Top-k never uses the Topology,
  // so Hybrid goes with CSC).
  SUBCASE("CSC + Hybrid") { check_all(Exchanger<Sparsifier<CSC<4, 50>>, Topology<Hybrid<64, 1>>>{}); }
}

TEST_CASE("checkpoint errors: foreign bytes, a newer format version, a bad stream, a non-finite residual") {
  using E = Exchanger<Sparsifier<TopK<0.05>>>;
  inproc::run(1, [](inproc::transport& t) {
    on_inproc<E> ex(t, test_layout());
    (void)step(ex, 0, 0);
    CHECK(contains(load_fails<parse_error>(ex, "not a checkpoint at all"), "in 'magic'"));
    CHECK(contains(load_fails<parse_error>(ex, ""), "truncated"));
    std::ostringstream f;
    ex.save_state(f);
    const std::string good = f.str();
    {
      std::string v2 = good;
      v2[8] = 5;  // the format version (a newer one), little-endian
      const std::string msg = load_fails<parse_error>(ex, v2);
      CHECK(contains(msg, "in 'version'"));
      CHECK(contains(msg, "format version 5; this gflow reads version 4"));
    }
    {
      // A non-finite residual with a valid checksum (a hand-made file): rejected by value.
      std::ostringstream g;
      detail::checkpoint_writer w(g);
      detail::write_checkpoint_header(w, detail::make_checkpoint_identity<E::policies>(test_layout(), 0, 1, ex.pool_size()));
      w.tag(detail::section_tag("EXCH"));
      w.u64(1);
      w.u64(0);
      w.u64(0);
      w.u64(0);  // learn_order: off
      w.tag(detail::section_tag("TOPO"));
      w.tag(detail::section_tag("SPRS"));
      w.u32(4);
      w.f64(0.05);
      w.u64(0);
      w.f64(0.05);
      std::vector<float> res(ex.pool_size(), 0.0f);
      res[17] = std::numeric_limits<float>::infinity();
      w.array(res.data(), res.size());
      w.checksum();
      const std::string msg = load_fails<parse_error>(ex, g.str());
      CHECK(contains(msg, "in 'residual'"));
      CHECK(contains(msg, "non-finite value at pool index 17"));
    }
    {
      std::ostringstream bad;
      bad.setstate(std::ios::badbit);
      try {
        ex.save_state(bad);
        FAIL("expected an error");
      } catch (const invalid_argument& e) {
        CHECK(e.subject() == "out");
      }
    }
  });
}

TEST_CASE("checkpoint errors: save and load in the middle of an iteration are usage errors") {
  using E = Exchanger<Sparsifier<CSC<64, 20>>>;
  inproc::run(1, [](inproc::transport& t) {
    on_inproc<E> ex(t, test_layout());
    std::stringstream f;
    ex.save_state(f);
    ex.ready(0);
    for (auto call : {0, 1}) {
      try {
        if (call == 0) ex.save_state(f);
        else ex.load_state(f);
        FAIL("expected a usage_error");
      } catch (const usage_error& e) {
        CHECK(e.subject() == (call == 0 ? "save_state" : "load_state"));
        CHECK(contains(e.what(), "in the middle of iteration 0 (1 of 6 tensors ready)"));
        CHECK(contains(e.what(), std::string("Fix: call ") + (call == 0 ? "save_state" : "load_state") + "() between finish() and the next ready()."));
      }
    }
    for (std::size_t i = 1; i < 6; ++i) ex.ready(i);
    (void)ex.finish();
    ex.load_state(f);  // between iterations again: fine
    CHECK(ex.iteration() == 0);
  });
}
