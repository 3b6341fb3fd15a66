// The training-loop features (docs/DESIGN.md, "Training loops"): gradient accumulation
// (no_sync), unused tensors (find_unused), uneven inputs (join) and the learned generation order
// (learn_order), on the in-process and mock transports, over every supported composition.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "accumulation_steps.hpp"
#include "compositions.hpp"
#include "test_values.hpp"

using namespace gflow;
using namespace gflow_test;

namespace {

// Seven tensors of different sizes: with Fusion<256> (64 fp32 elements) several buckets.
Layout loop_layout() { return Layout::from_sizes({40, 7, 90, 3, 64, 17, 33}); }

std::vector<float> pool_copy(auto& ex) { return std::vector<float>(ex.pool_data(), ex.pool_data() + ex.pool_size()); }

// Every tensor's view, in layout order (independent of the pool's order).
std::vector<float> views_copy(auto& ex) {
  std::vector<float> out;
  for (std::size_t i = 0; i < ex.layout().size(); ++i) out.insert(out.end(), ex.view(i).begin(), ex.view(i).end());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class E>
const char* name_of() {
  static const std::string n = detail::composition_name<typename E::policies>();
  return n.c_str();
}

// The micro-batch gradient of (rank, tensor, element, step, micro-batch).
float micro(int r, std::size_t i, std::size_t j, int step, int m) { return uniform_value(r, i, j, step * 16 + m); }

template <class E>
void accumulation_equals_one_exchange(int micro_batches) {
  const Layout l = loop_layout();
  std::mutex mu;
  std::vector<std::vector<float>> acc(3), once(3);
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> a(t, l), b(t, l);
    for (int step = 0; step < 3; ++step) {
      accumulate_then_exchange(a, b, micro_batches, [&](std::size_t i, std::size_t j, int m) { return micro(t.rank(), i, j, step, m); });
      CHECK(a.iteration() == b.iteration());
    }
    std::lock_guard lk(mu);
    acc[t.rank()] = pool_copy(a);
    once[t.rank()] = pool_copy(b);
  });
  for (int r = 0; r < 3; ++r) CHECK_MESSAGE(same_bits(acc[r], once[r]), name_of<E>(), " with ", micro_batches, " micro-batches, rank ", r);
}

}  // namespace

TEST_CASE("no_sync: M micro-batches then one exchange are bitwise one exchange of the summed gradient, every composition") {
  for (int m : {1, 2, 3, 8}) for_each_type<supported>([&]<class E>() { accumulation_equals_one_exchange<E>(m); });
}

TEST_CASE("no_sync: ready(i, source) adds to what the view holds within the window, copies otherwise") {
  const Layout l = Layout::from_sizes({5, 3});
  inproc::run(2, [&](inproc::transport& t) {  // both ranks alike: the average is what each holds
    on_inproc<Exchanger<>> ex(t, l);
    const std::vector<float> a{1, 2, 3, 4, 5}, b{10, 20, 30, 40, 50}, c{100, 200, 300};
    std::fill(ex.view(0).begin(), ex.view(0).end(), 7.0f);  // stale: the first copy overwrites it
    {
      auto s = ex.no_sync();
      ex.ready(0, a);
      ex.ready(0, b);
      ex.ready(1, c);
    }
    ex.ready(0, a);
    ex.ready(1, c);
    (void)ex.finish();
    CHECK(std::vector<float>(ex.view(0).begin(), ex.view(0).end()) == std::vector<float>{12, 24, 36, 48, 60});
    CHECK(std::vector<float>(ex.view(1).begin(), ex.view(1).end()) == std::vector<float>{200, 400, 600});
    ex.ready(0, a);  // the next iteration copies again
    ex.ready(1, c);
    (void)ex.finish();
    CHECK(ex.view(0)[4] == 5.0f);
  });
}

TEST_CASE("no_sync: nothing is sent inside the scope; the exchange after it sends every bucket once") {
  mock_t m(2, 0);
  on_mock<Exchanger<>> ex(m, Layout::from_sizes({5, 3}));
  m.calls().clear();
  for (int mb = 0; mb < 3; ++mb) {
    auto s = ex.no_sync();
    ex.ready(0);
    ex.ready(1);
  }
  CHECK(m.calls().records.empty());
  CHECK(m.calls().control.empty());
  ex.ready(1);
  ex.ready(0);
  (void)ex.finish();
  CHECK(m.calls().of(mock::op::all_reduce).size() == 2);
}

TEST_CASE("no_sync: a tensor accumulated in the window but not marked in the last pass still counts as ready") {
  const Layout l = Layout::from_sizes({4, 4});
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<Exchanger<>> ex(t, l);
    std::fill(ex.view(0).begin(), ex.view(0).end(), 1.0f);
    std::fill(ex.view(1).begin(), ex.view(1).end(), 2.0f);
    {
      auto s = ex.no_sync();
      ex.ready(0);
      ex.ready(1);
    }
    ex.ready(1);  // the last micro-batch does not touch tensor 0
    (void)ex.finish();
    CHECK(ex.view(0)[0] == 1.0f);
    CHECK(ex.view(1)[3] == 2.0f);
  });
}

TEST_CASE("no_sync: misuse is a usage_error naming the call and the fix") {
  const Layout l = Layout::from_sizes({4, 4});
  mock_t m(2, 0);
  on_mock<Exchanger<>> ex(m, l);
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no usage_error");
  };
  SUBCASE("finish() inside the scope") {
    auto s = ex.no_sync();
    ex.ready(0);
    ex.ready(1);
    const std::string e = msg([&] { (void)ex.finish(); });
    CHECK(e.find("usage error in 'finish': finish() was called inside a no_sync() scope") != std::string::npos);
    CHECK(e.find("Fix: let the scope end before the last micro-batch's backward") != std::string::npos);
  }
  SUBCASE("no_sync() in the middle of an exchanging iteration") {
    ex.ready(0);
    const std::string e = msg([&] { (void)ex.no_sync(); });
    CHECK(e.find("usage error in 'no_sync': no_sync was called in the middle of iteration 0 (1 of 2 tensors ready).") != std::string::npos);
  }
  SUBCASE("save_state inside the scope and after it, before the exchange") {
    std::ostringstream out;
    {
      auto s = ex.no_sync();
      ex.ready(0);
      const std::string e = msg([&] { ex.save_state(out); });
      CHECK(e.find("usage error in 'save_state': save_state was called inside a no_sync() scope, before the exchange that ends the accumulation.") !=
            std::string::npos);
      CHECK(e.find("Fix: end the accumulation first") != std::string::npos);
    }
    const std::string e = msg([&] { ex.save_state(out); });
    CHECK(e.find("save_state was called while the views hold gradients accumulated under no_sync()") != std::string::npos);
    ex.ready(0);
    ex.ready(1);
    (void)ex.finish();
    CHECK_NOTHROW(ex.save_state(out));
  }
  SUBCASE("scopes nest; the exchange waits for the outermost") {
    {
      auto a = ex.no_sync();
      {
        auto b = ex.no_sync();
        ex.ready(0);
      }
      ex.ready(1);
      CHECK(m.calls().records.empty());
    }
    ex.ready(0);
    ex.ready(1);
    CHECK_NOTHROW((void)ex.finish());
  }
}

// ---- find_unused ---------------------------------------------------------------------------------
namespace {
// Which tensors rank r leaves out: tensor 1 on every rank; tensor 3 on rank 0 only; tensor 5 on
// every rank but rank 2.
bool skips(int r, std::size_t i) { return i == 1 || (i == 3 && r == 0) || (i == 5 && r != 2); }
}  // namespace

TEST_CASE("find_unused: a tensor a rank did not mark averages with zeros, divided by P; unused lists those no rank marked") {
  const Layout l = loop_layout();
  for_each_type<supported>([&]<class E>() {
    std::mutex mu;
    std::vector<std::vector<float>> res(3);
    std::vector<std::vector<std::size_t>> unused(3);
    inproc::run(3, [&](inproc::transport& t) {
      exchange_options o;
      o.find_unused = true;
      on_inproc<E> ex(t, l, o);
      for (int step = 0; step < 2; ++step) {
        for (std::size_t i = l.size(); i-- > 0;) {
          auto v = ex.view(i);
          if (skips(t.rank(), i)) {
            std::fill(v.begin(), v.end(), 1e9f);  // stale garbage: must not reach the exchange
            continue;
          }
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(t.rank() + 1);
          ex.ready(i);
        }
        const auto st = ex.finish();
        std::lock_guard lk(mu);
        unused[t.rank()] = st.unused;
        CHECK(st.contributors == 3);
      }
      std::lock_guard lk(mu);
      res[t.rank()] = views_copy(ex);
    });
    for (int r = 0; r < 3; ++r) CHECK_MESSAGE(unused[r] == std::vector<std::size_t>{1}, name_of<E>());
    for (int r = 1; r < 3; ++r) CHECK_MESSAGE(same_bits(res[r], res[0]), name_of<E>(), ": ranks agree");
    if constexpr (E::policies::sparsifier::dense) {
      // Exact expectations where every value is exchanged: (sum of the users' r + 1) / 3.
      std::size_t off = 0;
      for (std::size_t i = 0; i < l.size(); ++i) {
        float sum = 0.0f;
        for (int r = 0; r < 3; ++r) sum += skips(r, i) ? 0.0f : static_cast<float>(r + 1);
        const float want = sum / 3.0f;
        for (std::size_t j = 0; j < l[i].numel; ++j)
          CHECK_MESSAGE(res[0][off + j] == doctest::Approx(want).epsilon(1e-2), name_of<E>(), " tensor ", i);
        if (i == 1) CHECK_MESSAGE(res[0][off] == 0.0f, name_of<E>(), ": an unused tensor's view holds zeros");
        off += l[i].numel;
      }
    }
  });
}

TEST_CASE("find_unused with a sparsifier: a tensor no rank used may carry released residual, and nothing is lost") {
  // One rank (exact: the average divides by 1): what the view holds plus what stays in the
  // residual is, element by element, what was fed plus the residual before.
  const Layout l = Layout::from_sizes({64, 64});
  inproc::run(1, [&](inproc::transport& t) {
    exchange_options o;
    o.find_unused = true;
    on_inproc<Exchanger<Sparsifier<TopK<0.1>>>> ex(t, l, o);
    for (std::size_t i = 0; i < 2; ++i) {
      auto v = ex.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform_value(0, i, j, 0);
      ex.ready(i);
    }
    (void)ex.finish();
    const std::vector<float> before(ex.sparsifier().residual().begin(), ex.sparsifier().residual().end());
    // Iteration 1: tensor 0 is marked with small values, tensor 1 with nothing (unused everywhere).
    for (float& g : ex.view(0)) g = 1e-3f;
    ex.ready(0);
    std::fill(ex.view(1).begin(), ex.view(1).end(), 1e9f);  // stale: replaced by zeros
    const auto st = ex.finish();
    CHECK(st.unused == std::vector<std::size_t>{1});
    const auto after = ex.sparsifier().residual();
    const std::size_t off = ex.pool_plan().offset[1];
    bool released = false;
    for (std::size_t j = 0; j < 64; ++j) {
      const float out = ex.view(1)[j];
      released = released || out != 0.0f;
      CHECK(out + after[off + j] == before[off + j]);  // exact: one of the two is zero
      CHECK((out == 0.0f || after[off + j] == 0.0f));
    }
    CHECK(released);  // the selection took tensor 1's residual (larger than tensor 0's 1e-3)
  });
}

TEST_CASE("find_unused: a bucket with no missing tensor launches during backward; only the waiting ones wait for finish()") {
  const Layout l = Layout::from_sizes({8, 8, 8, 8});  // no fusion: one bucket per tensor, pool order 3, 2, 1, 0
  mock_t m(2, 0);
  exchange_options o;
  o.find_unused = true;
  on_mock<Exchanger<>> ex(m, l, o);
  const std::size_t control_before = m.calls().control.size();
  ex.ready(3);
  ex.ready(2);
  ex.ready(0);  // tensor 1 is never marked
  CHECK(m.calls().of(mock::op::all_reduce).size() == 2);  // tensors 3 and 2; 1 holds back 0
  const auto st = ex.finish();
  CHECK(m.calls().of(mock::op::all_reduce).size() == 4);
  CHECK(st.unused == std::vector<std::size_t>{1});  // the mock's other rank plays this one
  CHECK(m.calls().control.size() == control_before + 1);  // one all_gather of the bits, on the control channel
}

TEST_CASE("find_unused: without the option a missing tensor stays the usage error, and it names the option") {
  const Layout l = Layout::from_sizes({4, 4});
  mock_t m(2, 0);
  on_mock<Exchanger<>> ex(m, l);
  ex.ready(1);
  try {
    (void)ex.finish();
    FAIL("no error");
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("1 of 2 tensors are not ready in iteration 0; the first is tensor 0 ('t0').") != std::string::npos);
    CHECK(std::string(e.what()).find("construct the exchanger with exchange_options::find_unused = true (on every rank)") != std::string::npos);
  }
}

TEST_CASE("find_unused: a rank that marks nothing at all, and every rank marking nothing") {
  const Layout l = Layout::from_sizes({4, 6});
  inproc::run(3, [&](inproc::transport& t) {
    exchange_options o;
    o.find_unused = true;
    on_inproc<Exchanger<Precision<half>>> ex(t, l, o);
    if (t.rank() == 1) {
      for (std::size_t i = 0; i < 2; ++i) {
        std::fill(ex.view(i).begin(), ex.view(i).end(), 3.0f);
        ex.ready(i);
      }
    }
    auto st = ex.finish();
    CHECK(st.unused.empty());
    CHECK(ex.view(0)[0] == 1.0f);  // 3 / 3
    st = ex.finish();              // nobody marks anything
    CHECK(st.unused == std::vector<std::size_t>{0, 1});
    CHECK(ex.view(1)[5] == 0.0f);
  });
}

// ---- join ----------------------------------------------------------------------------------------
namespace {
template <class E>
void uneven(int P, std::vector<int> batches) {
  const Layout l = loop_layout();
  const int most = *std::max_element(batches.begin(), batches.end());
  std::mutex mu;
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(P));
  std::vector<join_status> js(static_cast<std::size_t>(P));
  inproc::run(P, [&](inproc::transport& t) {
    exchange_options o;
    o.uneven_inputs = true;
    on_inproc<E> ex(t, l, o);
    const int mine = batches[static_cast<std::size_t>(t.rank())];
    for (int step = 0; step < mine; ++step) {
      for (std::size_t i = l.size(); i-- > 0;) {
        auto v = ex.view(i);
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>((t.rank() + 1) * (step + 1) + static_cast<int>(j % 3));
        ex.ready(i);
      }
      const auto st = ex.finish();
      int active = 0;
      for (int b : batches) active += b > step;
      CHECK(st.contributors == active);
      std::lock_guard lk(mu);
      got[static_cast<std::size_t>(t.rank())].push_back(views_copy(ex));
    }
    const join_status s = ex.join();
    CHECK(s.shadowed == static_cast<std::uint64_t>(most - mine));
    CHECK(ex.iteration() == static_cast<std::uint64_t>(most));
    std::lock_guard lk(mu);
    js[static_cast<std::size_t>(t.rank())] = s;
  });
  int last = 0;
  while (batches[static_cast<std::size_t>(last)] != most) ++last;
  for (int r = 0; r < P; ++r) CHECK_MESSAGE(js[static_cast<std::size_t>(r)].last_rank == last, name_of<E>());
  // Each step's average is over the ranks that trained in it.
  for (int r = 0; r < P; ++r)
    for (int step = 0; step < batches[static_cast<std::size_t>(r)]; ++step) {
      const auto& v = got[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)];
      std::size_t k = 0;
      for (std::size_t i = 0; i < l.size(); ++i)
        for (std::size_t j = 0; j < l[i].numel; ++j, ++k) {
          float sum = 0.0f;
          int active = 0;
          for (int q = 0; q < P; ++q)
            if (batches[static_cast<std::size_t>(q)] > step) {
              sum += static_cast<float>((q + 1) * (step + 1) + static_cast<int>(j % 3));
              ++active;
            }
          const float want = sum * (1.0f / static_cast<float>(active));
          if constexpr (sizeof(typename on_inproc<E>::wire_type) == 4)
            REQUIRE_MESSAGE(v[k] == want, name_of<E>(), " rank ", r, " step ", step, " tensor ", i);
          else
            REQUIRE_MESSAGE(v[k] == doctest::Approx(want).epsilon(2e-2), name_of<E>(), " rank ", r, " step ", step, " tensor ", i);
        }
    }
}
}  // namespace

TEST_CASE("join: uneven inputs on 2 to 5 ranks, one, several or all but one rank running out early, every dense composition") {
  const std::vector<std::vector<int>> splits = {{3, 1}, {2, 2}, {0, 2, 3}, {4, 1, 1}, {1, 3, 2, 3}, {2, 2, 2, 0}, {5, 1, 2, 4, 3}, {1, 1, 1, 1, 4}};
  for (const auto& b : splits)
    for_each_type<supported>([&]<class E>() {
      if constexpr (E::policies::sparsifier::dense) {
        uneven<E>(static_cast<int>(b.size()), b);
      }
    });
}

TEST_CASE("join: misuse is a usage_error naming the fix") {
  const Layout l = Layout::from_sizes({4, 4});
  mock_t m(2, 0);
  SUBCASE("without exchange_options::uneven_inputs") {
    on_mock<Exchanger<>> ex(m, l);
    try {
      (void)ex.join();
      FAIL("no error");
    } catch (const usage_error& e) {
      CHECK(std::string(e.what()) ==
            "gflow: usage error in 'join': join() needs exchange_options::uneven_inputs, which makes every iteration count the ranks still "
            "training. Fix: construct the exchanger with exchange_options::uneven_inputs = true on every rank.");
    }
  }
  SUBCASE("in the middle of an iteration, and with an accumulation pending") {
    exchange_options o;
    o.uneven_inputs = true;
    on_mock<Exchanger<>> ex(m, l, o);
    ex.ready(0);
    CHECK_THROWS_WITH_AS((void)ex.join(), doctest::Contains("join was called in the middle of iteration 0 (1 of 2 tensors ready)"), usage_error);
    ex.ready(1);
    (void)ex.finish();
    {
      auto s = ex.no_sync();
      ex.ready(0);
    }
    CHECK_THROWS_WITH_AS((void)ex.join(), doctest::Contains("join was called while the views hold gradients accumulated under no_sync()"),
                         usage_error);
  }
}

// ---- learn_order ---------------------------------------------------------------------------------
namespace {
// A backward whose order is not the reverse of the forward order: tensor 0 (a shared embedding,
// say) is ready right after tensor 6, and tensor 4 last.
const std::vector<std::size_t> observed = {6, 0, 5, 3, 2, 1, 4};
}  // namespace

TEST_CASE("learn_order: rank 0's observed order becomes every rank's pool order; results are those of the default order") {
  const Layout l = loop_layout();
  for_each_type<supported>([&]<class E>() {
    std::mutex mu;
    std::vector<std::vector<float>> learned(3), plain(3);
    inproc::run(3, [&](inproc::transport& t) {
      exchange_options o;
      o.learn_order = true;
      on_inproc<E> a(t, l, o), b(t, l);
      CHECK(a.generation() == 0);
      for (int step = 0; step < 3; ++step) {
        // Rank 1 marks in another order: rank 0's order is the one every rank takes.
        std::vector<std::size_t> order = observed;
        if (t.rank() == 1) std::reverse(order.begin(), order.end());
        // One exchanger's iteration after the other's: both issue collectives on t.
        for (auto* ex : {&a, &b}) {
          for (std::size_t i : order) {
            auto v = ex->view(i);
            for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform_value(t.rank(), i, j, step);
            ex->ready(i);
          }
          (void)ex->finish();
        }
        CHECK(a.generation() == 1);
        CHECK(a.pool_plan().tensor_at == observed);
        if constexpr (E::policies::sparsifier::dense) {
          std::lock_guard lk(mu);
          CHECK_MESSAGE(same_bits(views_copy(a), views_copy(b)), name_of<E>(), " step ", step);
        }
      }
      std::lock_guard lk(mu);
      learned[t.rank()] = views_copy(a);
    });
    for (int r = 1; r < 3; ++r) CHECK_MESSAGE(same_bits(learned[r], learned[0]), name_of<E>(), ": ranks agree");
  });
}

TEST_CASE("learn_order: after the first iteration a late tensor no longer holds back the buckets before it") {
  const Layout l = Layout::from_sizes({8, 8, 8, 8});
  // Tensor 3, first in the default pool order, is ready last: without the learned order no
  // bucket launches before it, with it the other three do.
  auto before_last = [&](bool learn) {
    mock_t m(2, 0);
    exchange_options o;
    o.learn_order = learn;
    on_mock<Exchanger<>> ex(m, l, o);
    std::size_t n = 0;
    for (int step = 0; step < 2; ++step) {
      m.calls().clear();
      for (std::size_t i : {2, 1, 0}) ex.ready(i);
      n = m.calls().of(mock::op::all_reduce).size();
      ex.ready(3);
      (void)ex.finish();
    }
    return n;
  };
  CHECK(before_last(false) == 0);
  CHECK(before_last(true) == 3);
}

TEST_CASE("learn_order: checkpoints keep the learned order; resume is bitwise; another learn_order is a mismatch") {
  const Layout l = loop_layout();
  using E = Exchanger<Sparsifier<TopK<0.1>>, Fusion<256>>;
  inproc::run(2, [&](inproc::transport& t) {
    exchange_options o;
    o.learn_order = true;
    auto feed = [&](auto& ex, int step) {
      for (std::size_t i : observed) {
        auto v = ex.view(i);
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform_value(t.rank(), i, j, step);
        ex.ready(i);
      }
      (void)ex.finish();
    };
    on_inproc<E> a(t, l, o);
    for (int s = 0; s < 2; ++s) feed(a, s);
    std::ostringstream ck;
    a.save_state(ck);
    for (int s = 2; s < 4; ++s) feed(a, s);

    on_inproc<E> b(t, l, o);
    std::istringstream in(ck.str());
    b.load_state(in);
    CHECK(b.generation() == 1);
    CHECK(b.pool_plan().tensor_at == observed);
    for (int s = 2; s < 4; ++s) feed(b, s);
    CHECK(same_bits(pool_copy(a), pool_copy(b)));

    on_inproc<E> c(t, l);
    std::istringstream in2(ck.str());
    CHECK_THROWS_WITH_AS(c.load_state(in2),
                         "gflow: rank mismatch in 'learn_order': the checkpoint was saved by an exchanger with learn_order on; this one has "
                         "it off. Fix: construct the exchanger with the exchange_options::learn_order of the run that saved the checkpoint.",
                         mismatch_error);
  });
}

TEST_CASE("learn_order: a corrupt learn_order field is a parse_error naming it") {
  const Layout l = Layout::from_sizes({4, 4, 4});
  mock_t m(1, 0);
  exchange_options o;
  o.learn_order = true;
  on_mock<Exchanger<>> ex(m, l, o);
  auto load = [&](std::uint64_t state, std::vector<std::uint64_t> order) {
    std::ostringstream g;
    detail::checkpoint_writer w(g);
    detail::write_checkpoint_header(w, detail::make_checkpoint_identity<Exchanger<>::policies>(l, 0, 1, ex.pool_size()));
    w.tag(detail::section_tag("EXCH"));
    w.u64(1);
    w.u64(0);
    w.u64(0);
    w.u64(state);
    for (auto i : order) w.u64(i);
    w.tag(detail::section_tag("TOPO"));
    w.tag(detail::section_tag("SPRS"));
    w.checksum();
    w.finish();
    std::istringstream in(g.str());
    try {
      ex.load_state(in);
    } catch (const parse_error& e) {
      CHECK(e.subject() == "learn_order");
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  CHECK(load(7, {}).find("the learn_order state is 7; 0, 1 or 2 were written.") != std::string::npos);
  CHECK(load(2, {0, 2, 0}).find("the learned order names tensor 0 twice or past the layout.") != std::string::npos);
  CHECK(load(2, {0, 2, 9}).find("the learned order names tensor 9 twice or past the layout.") != std::string::npos);
  CHECK(load(2, {2, 0, 1}) == "loaded");
  CHECK(ex.pool_plan().tensor_at == std::vector<std::size_t>{2, 0, 1});
  CHECK(ex.generation() == 1);
}

TEST_CASE("the training-loop options are part of the cross-rank consistency check") {
  const Layout l = Layout::from_sizes({4});
  std::mutex mu;
  std::vector<std::string> msgs;
  inproc::run(2, [&](inproc::transport& t) {
    exchange_options o;
    o.find_unused = t.rank() == 0;
    try {
      on_inproc<Exchanger<>> ex(t, l, o);
    } catch (const mismatch_error& e) {
      std::lock_guard lk(mu);
      msgs.push_back(e.what());
    }
  });
  REQUIRE(msgs.size() == 2);
  for (const auto& s : msgs) CHECK(s.find("rank 0 has average true, find_unused true") != std::string::npos);
}
