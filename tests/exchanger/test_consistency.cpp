// The cross-rank consistency check made when an exchanger is constructed (exchanger/consistency.hpp)
// and the in-process transport's timeouts seen through the exchanger: ranks that disagree or a
// rank that is gone produce a typed error on every surviving rank, never a hang.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_inproc;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Layout base_layout() {
  return Layout({{"conv1.weight", {64, 3, 7, 7}, 9408}, {"conv1.bias", {64}, 64}, {"fc.weight", {10, 64}, 640}, {"fc.bias", {10}, 10}});
}

/// Runs `make(t)` (which constructs an exchanger) on P thread ranks; returns each rank's
/// mismatch_error message ("" where construction succeeded) and checks the subject.
template <class Make>
std::vector<std::string> mismatch_messages(int P, Make make, const char* subject) {
  std::vector<std::string> msgs(static_cast<std::size_t>(P));
  std::mutex m;
  inproc::run(
      P,
      [&](inproc::transport& t) {
        try {
          make(t);
        } catch (const mismatch_error& e) {
          std::lock_guard lk(m);
          msgs[static_cast<std::size_t>(t.rank())] = e.what();
          CHECK(e.subject() == subject);
          CHECK(e.code() == errc::mismatch);
        }
      },
      std::chrono::seconds(20));  // far above what the check takes: a hang would show as a timeout_error
  return msgs;
}

/// The message without its "Raised on rank R of P." tail: the part every rank shares.
std::string shared_part(const std::string& s) { return s.substr(0, s.find("Raised on rank")); }

}  // namespace

TEST_CASE("consistency: identical ranks pass with one all_gather of the header (mock), none on one rank") {
  auto m = mock::transport(4, 1);
  Exchanger<Fusion<1024>>::on<mock::transport> ex(m, base_layout());
  const auto& ctl = m.calls().control;
  REQUIRE(ctl.size() == 1);
  CHECK(ctl[0].kind == mock::op::all_gather);
  CHECK(ctl[0].type == dtype::u64);
  CHECK(ctl[0].count == 4);
  CHECK(m.calls().records.empty());  // the gradient traffic log is untouched

  auto solo = mock::transport(1, 0);
  Exchanger<>::on<mock::transport> one(solo, base_layout());
  CHECK(solo.calls().control.empty());  // nothing to compare with

  exchange_options off;
  off.verify = false;
  auto quiet = mock::transport(4, 0);
  Exchanger<>::on<mock::transport> unchecked(quiet, base_layout(), off);
  CHECK(quiet.calls().control.empty());
}

TEST_CASE("consistency: identical layouts and policies construct and exchange on 1..5 ranks") {
  for (int P = 1; P <= 5; ++P) {
    inproc::run(P, [&](inproc::transport& t) {
      on_inproc<Exchanger<Fusion<1024>, Precision<bfloat16>>> ex(t, base_layout());
      for (std::size_t i = 0; i < ex.layout().size(); ++i) {
        for (float& v : ex.view(i)) v = 2.0f;
        ex.ready(i);
      }
      CHECK(ex.finish().finite());
      CHECK(ex.view(0)[0] == 2.0f);
    });
  }
}

TEST_CASE("consistency: a tensor whose size differs on one rank is named on every rank") {
  const int P = 4;
  auto msgs = mismatch_messages(
      P,
      [](inproc::transport& t) {
        std::vector<tensor_desc> ts = base_layout().tensors();
        if (t.rank() == 2) ts[2] = {"fc.weight", {10, 32}, 320};
        on_inproc<Exchanger<>> ex(t, Layout(ts));
      },
      "layout");
  for (int r = 0; r < P; ++r) {
    const std::string& s = msgs[static_cast<std::size_t>(r)];
    REQUIRE_MESSAGE(!s.empty(), "rank " << r << " raised nothing");
    CHECK(has(s, "gflow: rank mismatch in 'layout'"));
    CHECK(has(s, "the first difference is tensor 2 (layout index, forward order)"));
    CHECK(has(s, "rank 0 has 'fc.weight' [10x64] (640 elements), rank 2 has 'fc.weight' [10x32] (320 elements)"));
    CHECK(has(s, "ranks whose layout differs from rank 0's: 2."));
    CHECK(has(s, "Raised on rank " + std::to_string(r) + " of 4."));
    CHECK(has(s, "Fix: construct the exchanger with the same Layout"));
    CHECK(shared_part(s) == shared_part(msgs[0]));
  }
}

TEST_CASE("consistency: order, names, shapes and counts all count; the first differing rank is reported") {
  SUBCASE("swapped order") {
    auto msgs = mismatch_messages(
        3,
        [](inproc::transport& t) {
          std::vector<tensor_desc> ts = base_layout().tensors();
          if (t.rank() >= 1) std::swap(ts[1], ts[3]);
          on_inproc<Exchanger<>> ex(t, Layout(ts));
        },
        "layout");
    for (const auto& s : msgs) {
      CHECK(has(s, "first difference is tensor 1"));
      CHECK(has(s, "rank 0 has 'conv1.bias' [64] (64 elements), rank 1 has 'fc.bias' [10] (10 elements)"));
      CHECK(has(s, "differs from rank 0's: 1, 2."));
    }
  }
  SUBCASE("a renamed tensor with the same size") {
    auto msgs = mismatch_messages(
        2,
        [](inproc::transport& t) {
          std::vector<tensor_desc> ts = base_layout().tensors();
          if (t.rank() == 1) ts[0].name = "stem.weight";
          on_inproc<Exchanger<>> ex(t, Layout(ts));
        },
        "layout");
    for (const auto& s : msgs) CHECK(has(s, "rank 0 has 'conv1.weight' [64x3x7x7] (9408 elements), rank 1 has 'stem.weight'"));
  }
  SUBCASE("same element count, another shape") {
    auto msgs = mismatch_messages(
        2,
        [](inproc::transport& t) {
          std::vector<tensor_desc> ts = base_layout().tensors();
          if (t.rank() == 1) ts[2].shape = {64, 10};
          on_inproc<Exchanger<>> ex(t, Layout(ts));
        },
        "layout");
    for (const auto& s : msgs) CHECK(has(s, "rank 1 has 'fc.weight' [64x10] (640 elements)"));
  }
  SUBCASE("an extra tensor on one rank; a missing one on another") {
    auto msgs = mismatch_messages(
        4,
        [](inproc::transport& t) {
          std::vector<tensor_desc> ts = base_layout().tensors();
          if (t.rank() == 1) ts.push_back({"extra", {5}, 5});
          if (t.rank() == 3) ts.pop_back();
          on_inproc<Exchanger<>> ex(t, Layout(ts));
        },
        "layout");
    for (const auto& s : msgs) {
      CHECK(has(s, "(4 tensors on rank 0, 5 on rank 1)"));
      CHECK(has(s, "tensor 4 (layout index, forward order): rank 0 has no tensor 4 (its layout has 4 tensors), rank 1 has 'extra' [5]"));
      CHECK(has(s, "differs from rank 0's: 1, 3."));
    }
  }
}

TEST_CASE("consistency: different policy compositions are named, before any topology split can hang") {
  using Plain = Exchanger<Fusion<1024>>;
  using Half = Exchanger<Fusion<1024>, Precision<half>>;
  using Hier = Exchanger<Fusion<1024>, Topology<Hierarchical<2>>>;
  SUBCASE("precision") {
    auto msgs = mismatch_messages(
        3,
        [](inproc::transport& t) {
          if (t.rank() == 2) on_inproc<Half> ex(t, base_layout());
          else on_inproc<Plain> ex(t, base_layout());
        },
        "policies");
    for (const auto& s : msgs) {
      CHECK(has(s, "the policy compositions differ: rank 0 uses <gflow::Precision<>, gflow::Fusion<1024>, gflow::Sparsifier<>"));
      CHECK(has(s, "rank 2 uses <gflow::Precision<gflow::half>"));
      CHECK(has(s, "composition differs from rank 0's: 2."));
      CHECK_FALSE(has(s, "layouts differ"));
    }
  }
  SUBCASE("topology: Hierarchical splits in its constructor, Ring does not") {
    auto msgs = mismatch_messages(
        4,
        [](inproc::transport& t) {
          if (t.rank() == 0) on_inproc<Hier> ex(t, base_layout());
          else on_inproc<Plain> ex(t, base_layout());
        },
        "policies");
    for (const auto& s : msgs) {
      CHECK(has(s, "Hierarchical<2>"));
      CHECK(has(s, "differs from rank 0's: 1, 2, 3."));
    }
  }
  SUBCASE("policies and layout both differ: one error lists both, subject is the policies") {
    auto msgs = mismatch_messages(
        2,
        [](inproc::transport& t) {
          if (t.rank() == 1) on_inproc<Half> ex(t, Layout::from_sizes({3, 4}));
          else on_inproc<Plain> ex(t, base_layout());
        },
        "policies");
    for (const auto& s : msgs) {
      CHECK(has(s, "policy compositions differ"));
      CHECK(has(s, "layouts differ"));
      CHECK(has(s, "rank 0 has 'conv1.weight' [64x3x7x7] (9408 elements), rank 1 has 't0' [3] (3 elements)"));
    }
  }
}

TEST_CASE("consistency: run-time options that shape the exchange are compared") {
  SUBCASE("average") {
    auto msgs = mismatch_messages(
        3,
        [](inproc::transport& t) {
          exchange_options o;
          o.average = t.rank() != 1;
          on_inproc<Exchanger<Fusion<1024>>> ex(t, base_layout(), o);
        },
        "exchange_options");
    for (const auto& s : msgs) {
      CHECK(has(s, "rank 0 has average true, find_unused false, learn_order false, uneven_inputs false, rank 1 has average false, "
                   "find_unused false, learn_order false, uneven_inputs false"));
    }
  }
}

TEST_CASE("consistency: set_fusion compares the ranks' numbers before anyone re-plans") {
  SUBCASE("a different threshold or first bucket is a mismatch_error on every rank") {
    auto msgs = mismatch_messages(
        3,
        [](inproc::transport& t) {
          on_inproc<Exchanger<Fusion<1024>>> ex(t, base_layout());
          ex.set_fusion(t.rank() == 1 ? 2048 : 1024, t.rank() == 1 ? 256 : 0);
        },
        "set_fusion");
    for (const auto& s : msgs)
      CHECK(has(s, "rank 0 passes threshold_bytes 1024, first_bucket_bytes 0; rank 1 passes 2048, 256; ranks that differ from rank 0: 1."));
  }
  SUBCASE("the refused plan leaves every rank's buckets as they were, and the same numbers re-plan") {
    inproc::run(2, [](inproc::transport& t) {
      on_inproc<Exchanger<Fusion<1024>>> ex(t, base_layout());
      const std::size_t before = ex.buckets().size();
      CHECK_THROWS_AS(ex.set_fusion(t.rank() == 0 ? 64 : 128), gflow::mismatch_error);
      CHECK(ex.threshold_bytes() == 1024);
      CHECK(ex.buckets().size() == before);
      CHECK_NOTHROW(ex.set_fusion(64));
      CHECK(ex.threshold_bytes() == 64);
    });
  }
}

TEST_CASE("consistency: many differing ranks are listed up to 16, then counted") {
  auto msgs = mismatch_messages(
      20,
      [](inproc::transport& t) {
        std::vector<tensor_desc> ts = base_layout().tensors();
        if (t.rank() != 0) ts[3].numel = ts[3].shape[0] = 11;
        on_inproc<Exchanger<>> ex(t, Layout(ts));
      },
      "layout");
  for (const auto& s : msgs) CHECK(has(s, "differs from rank 0's: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 3 more."));
}

TEST_CASE("consistency: verify = false skips the check (and its collective) on every rank") {
  std::atomic<int> built{0};
  inproc::run(3, [&](inproc::transport& t) {
    exchange_options o;
    o.verify = false;
    on_inproc<Exchanger<>> ex(t, t.rank() == 1 ? Layout::from_sizes({1, 2}) : base_layout(), o);
    ++built;
  });
  CHECK(built == 3);
}

// ---- in-process timeouts through the exchanger --------------------------------------------------

TEST_CASE("timeouts: a rank that never constructs its exchanger is named by the others' check") {
  std::atomic<int> timeouts{0};
  const auto t0 = std::chrono::steady_clock::now();
  inproc::run(
      3,
      [&](inproc::transport& t) {
        if (t.rank() == 1) return;
        try {
          on_inproc<Exchanger<>> ex(t, base_layout());
        } catch (const timeout_error& e) {
          ++timeouts;
          CHECK(e.subject() == "all_gather");
          CHECK(has(e.what(), "rank(s) 1 did not arrive"));
        }
      },
      std::chrono::milliseconds(300));
  CHECK(timeouts == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("timeouts: ranks that leave mid-exchange are named in the survivors' timeout_error, within the timeout") {
  using E = Exchanger<Fusion<1024>>;
  const Layout l = Layout::from_sizes({300, 300, 300, 300, 300, 300});
  std::atomic<int> timeouts{0};
  std::mutex m;
  std::vector<std::chrono::steady_clock::duration> took;
  inproc::run(
      5,
      [&](inproc::transport& t) {
        on_inproc<E> ex(t, l);
        for (int it = 0; it < 3; ++it) {
          for (std::size_t i = l.size(); i-- > 0;) {
            // ranks 1 and 3 leave in iteration 2, after the first half of the pool
            if (it == 2 && i == 2 && (t.rank() == 1 || t.rank() == 3)) return;
            for (float& v : ex.view(i)) v = 1.0f;
            const auto t0 = std::chrono::steady_clock::now();
            try {
              ex.ready(i);
            } catch (const timeout_error& e) {
              std::lock_guard lk(m);
              took.push_back(std::chrono::steady_clock::now() - t0);
              ++timeouts;
              CHECK(e.subject() == "all_reduce");
              CHECK(has(e.what(), "rank(s) 1, 3 did not arrive"));
              return;
            }
          }
          CHECK(ex.finish().finite());
        }
      },
      std::chrono::milliseconds(400));
  CHECK(timeouts == 3);
  for (auto d : took) CHECK(d < std::chrono::milliseconds(400 + 2000));  // the timeout plus scheduling slack
}
