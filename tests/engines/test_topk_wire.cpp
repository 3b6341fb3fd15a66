// Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> on the wire: what the engines send (mock), bad
// settings, malformed received messages on every rank, and no allocation per iteration.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "compositions.hpp"
#include "topk_reference.hpp"

using namespace gflow;
using namespace gflow_test;
namespace k_ = gflow::detail::kernels;

// ---- what goes on the wire (mock) --------------------------------------------------------------

TEST_CASE("mock: TopK does exactly one all_gather of k packed pairs per selection, and nothing else") {
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77, 512});  // 5946 elements
  const std::size_t n = l.total_numel();
  SUBCASE("no fusion: one selection over the whole pool") {
    mock::transport m(4);
    on_mock<Exchanger<Sparsifier<TopK<0.01>>>> ex(m, l);
    for (int it = 0; it < 3; ++it) {
      m.calls().clear();
      for (std::size_t i = 0; i < l.size(); ++i) {
        for (auto& x : ex.view(i)) x = grad(0, 0, i * 10000 + static_cast<std::size_t>(&x - ex.view(i).data()), it);
        ex.ready(i);
        if (i + 1 < l.size()) CHECK(m.calls().records.empty());  // waits for the whole pool
      }
      auto st = ex.finish();
      const std::size_t k = gflow::detail::plan::k_for(0.01, n);
      REQUIRE(m.calls().records.size() == 1);
      const auto& r = m.calls().records[0];
      CHECK(r.kind == mock::op::all_gather);
      CHECK(r.type == dtype::u8);
      CHECK(r.count == 24 + k * (4 + 4));
      CHECK(st.wire_bytes == r.bytes);
      CHECK(ex.sparsifier().k() == k);
      CHECK(ex.sparsifier().selections() == 1);
      CHECK(ex.sparsifier().index_bytes() == 4);
      // Table I: what each rank receives from the P-1 others, headers aside
      CHECK((4 - 1) * (r.bytes - 24) == gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::topk_allreduce, 4, n, k, 4, 4));
    }
  }
  SUBCASE("fusion: one selection and one all_gather per bucket, k per bucket, 16-bit values") {
    mock::transport m(3);
    on_mock<Exchanger<Sparsifier<TopK<0.05>>, Fusion<2048>, Precision<half>>> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    const auto ag = m.calls().of(mock::op::all_gather);
    REQUIRE(ag.size() == ex.buckets().size());
    CHECK(m.calls().records.size() == ag.size());
    std::size_t ktot = 0;
    for (std::size_t b = 0; b < ag.size(); ++b) {
      const std::size_t k = gflow::detail::plan::k_for(0.05, ex.buckets()[b].count);
      ktot += k;
      CHECK(ag[b].count == 24 + k * (4 + 2));
    }
    CHECK(ex.sparsifier().k() == ktot);
    CHECK(ex.sparsifier().selections() == ex.buckets().size());
  }
  SUBCASE("64-bit indices on request") {
    mock::transport m(2);
    on_mock<Exchanger<Sparsifier<TopK<0.01>>>> ex(m, l);
    ex.sparsifier().set_index_bytes(8);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    CHECK(m.calls().records.at(0).count == 24 + gflow::detail::plan::k_for(0.01, n) * (8 + 4));
  }
}

TEST_CASE("mock: GTopK does ceil(log2 P) rounds of send/recv of one k-pair message, then one broadcast") {
  auto l = Layout::from_sizes({700, 300});
  const std::size_t n = 1000;
  const std::size_t k = gflow::detail::plan::k_for(0.01, n);  // 10
  const std::size_t mb = 24 + k * 8;
  using E = Exchanger<Sparsifier<GTopK<0.01>>>;
  auto run_one = [&](int P, int rank) {
    mock::transport m(P, rank);
    on_mock<E> ex(m, l);
    CHECK(ex.sparsifier().rounds() == gflow::detail::plan::gtopk_rounds(P));
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    auto st = ex.finish();
    std::vector<std::string> seq;
    for (const auto& r : m.calls().records) {
      CHECK(r.count == mb);
      CHECK(r.type == dtype::u8);
      seq.push_back(std::string(mock::to_string(r.kind)) + " " + std::to_string(r.peer));
    }
    std::size_t sent = 0;
    for (const auto& r : m.calls().records)
      if (r.kind != mock::op::recv) sent += r.bytes;
    CHECK(st.wire_bytes == sent);
    return seq;
  };
  CHECK(run_one(6, 0) == std::vector<std::string>{"recv 1", "recv 2", "recv 4", "broadcast 0"});
  CHECK(run_one(6, 3) == std::vector<std::string>{"send 2", "broadcast 0"});
  CHECK(run_one(6, 4) == std::vector<std::string>{"recv 5", "send 0", "broadcast 0"});
  CHECK(run_one(6, 5) == std::vector<std::string>{"send 4", "broadcast 0"});
  CHECK(run_one(1, 0) == std::vector<std::string>{"broadcast 0"});
  CHECK(run_one(16, 0) == std::vector<std::string>{"recv 1", "recv 2", "recv 4", "recv 8", "broadcast 0"});
  CHECK(run_one(16, 12) == std::vector<std::string>{"recv 13", "recv 14", "send 8", "broadcast 0"});
  // Table I on rank 0 (P = 8): log P received messages plus the broadcast, headers aside
  {
    mock::transport m(8, 0);
    on_mock<E> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    std::size_t payload = 0;
    for (const auto& r : m.calls().records) payload += r.bytes - 24;
    CHECK(payload == 4 * k * 8);  // 3 recv + 1 broadcast
    // the paper counts the flat-tree broadcast once per round: 2 log P messages of 2k elements
    CHECK(gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::gtopk_allreduce, 8, n, k, 4, 4) == 2 * 3 * k * 8);
  }
}

TEST_CASE("mock: GTopK rank 0 merges the queued messages exactly as Definition 1 says") {
  // P = 4, rank 0, k = 2 of 10 elements; rank 1 then rank 2 (holding 2 and 3 merged) send.
  auto l = Layout::from_sizes({10});
  mock::transport m(4, 0);
  on_mock<Exchanger<Sparsifier<GTopK<0.2>>>> ex(m, l);
  auto push = [&](std::vector<std::uint32_t> idx, std::vector<float> val) {
    std::vector<unsigned char> msg(gflow::detail::sparse_message::bytes(2, 4, 4));
    gflow::detail::sparse_message::pack(msg.data(), 2, idx.data(), val.data(), idx.size());
    m.calls().inbox.push_back(msg);
  };
  push({2, 7}, {5.0f, -1.0f});   // from rank 1
  push({3, 7}, {-4.5f, -6.0f});  // from rank 2
  // own G: top-2 are index 7 (3.0) and 2 (-2.0)
  const float own[10] = {0.1f, 0.2f, -2.0f, 0.5f, 0, 0, 0, 3.0f, 0, 0};
  std::copy(own, own + 10, ex.pool_data());
  ex.ready(0);
  auto st = ex.finish();
  CHECK(st.finite());
  // round 0: {2: 5 + -2 = 3, 7: -1 + 3 = 2} -> keep both; round 1: {2: 3, 3: -4.5, 7: 2 + -6 = -4} -> keep 3, 7
  // result = F / 4; 2 was dropped at rank 0 (value 3): not in F, so rank 0 restores only its own -2
  std::vector<float> want(10, 0.0f);
  want[3] = -4.5f / 4;
  want[7] = -4.0f * 0.25f;
  CHECK(std::vector<float>(ex.pool_data(), ex.pool_data() + 10) == want);
  auto res = ex.sparsifier().residual();
  CHECK(res[2] == -2.0f);  // own value whose index is not in the global top-k (line 10)
  CHECK(res[7] == 0.0f);
  CHECK(res[0] == 0.1f);
  CHECK(res[3] == 0.5f);
  CHECK(std::vector<std::uint64_t>(ex.sparsifier().exchanged().begin(), ex.sparsifier().exchanged().end()) == std::vector<std::uint64_t>{3, 7});
  CHECK(std::vector<std::uint64_t>(ex.sparsifier().selected().begin(), ex.sparsifier().selected().end()) == std::vector<std::uint64_t>{2, 7});
}

TEST_CASE("mock: a merge that drops a value whose index reaches the global top-k keeps it in the merging rank's residual") {
  // P = 4, rank 0, k = 1. Round 0 from rank 1: {5: 1.0}; own top-1 {5: 2.0}... use distinct indices:
  // own {4: 2.0}, rank 1 {5: 1.0}: merge keeps 4 (2.0), drops 5 (1.0). Round 1 from rank 2: {5: 10.0}:
  // merge {4: 2, 5: 10} keeps 5. F = {5: 10}: index 5 is global, so rank 0 keeps the dropped 1.0
  // (rank 1's value) and restores its own 2.0 at 4 (not global).
  auto l = Layout::from_sizes({8});
  mock::transport m(4, 0);
  on_mock<Exchanger<Sparsifier<GTopK<0.125>>>> ex(m, l);
  auto push = [&](std::uint32_t i, float v) {
    std::vector<unsigned char> msg(gflow::detail::sparse_message::bytes(1, 4, 4));
    gflow::detail::sparse_message::pack(msg.data(), 1, &i, &v, 1);
    m.calls().inbox.push_back(msg);
  };
  push(5, 1.0f);
  push(5, 10.0f);
  std::fill(ex.pool_data(), ex.pool_data() + 8, 0.0f);
  ex.pool_data()[4] = 2.0f;
  ex.ready(0);
  (void)ex.finish();
  CHECK(ex.pool_data()[5] == 10.0f / 4);
  auto res = ex.sparsifier().residual();
  CHECK(res[4] == 2.0f);
  CHECK(res[5] == 1.0f);
}

// ---- bad input -------------------------------------------------------------------------------------

TEST_CASE("bad settings: density, schedule and index width are validated") {
  auto l = Layout::from_sizes({100});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<TopK<0.1>>>> ex(m, l);
  for (double d : {0.0, -1.0, 1.0001, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      ex.sparsifier().set_density(d);
      FAIL("expected invalid_argument");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == "density");
    }
  }
  CHECK(ex.sparsifier().schedule() == gflow::detail::plan::density_schedule::constant(0.1));  // unchanged
  try {
    ex.sparsifier().set_index_bytes(2);
    FAIL("expected invalid_argument");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "index_bytes");
  }
}

namespace {
// A mock that lets the test rewrite the gathered bytes of one rank (TopK's received messages).
class tamper_transport : public mock::transport {
 public:
  using mock::transport::transport;
  explicit tamper_transport(mock::transport base) : mock::transport(std::move(base)) {}
  std::function<void(unsigned char* gathered, std::size_t block_bytes)> edit;
  template <wire_element E>
  void all_gather(const E* s, E* r, std::size_t n) {
    mock::transport::all_gather(s, r, n);
    if constexpr (std::is_same_v<E, std::uint8_t>)
      if (edit) edit(r, n);
  }
  tamper_transport split(int color, int key) { return tamper_transport(mock::transport::split(color, key)); }
};
static_assert(gflow::transport<tamper_transport>);

template <class Fn>
void expect_parse_error(Fn fn, const std::string& subject, const std::string& text) {
  try {
    fn();
    FAIL("expected gflow::parse_error in '" << subject << "'");
  } catch (const gflow::parse_error& e) {
    CHECK(e.subject() == subject);
    INFO(e.what());
    CHECK(std::string(e.what()).find(text) != std::string::npos);
    CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
  }
}
}  // namespace

TEST_CASE("bad input: a malformed all-gathered message is rejected on every rank, before the pool is touched") {
  auto l = Layout::from_sizes({50, 50});
  tamper_transport t(4);
  using E = Exchanger<Sparsifier<TopK<0.1>>>;
  typename E::template on<tamper_transport> ex(t, l);
  const std::size_t k = 10, mb = 24 + k * 8;
  auto run = [&] {
    for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = static_cast<float>(i);
    ex.ready(0);
    ex.ready(1);
  };
  auto at = [&](unsigned char* g, int rank, std::size_t byte) { return g + static_cast<std::size_t>(rank) * mb + byte; };
  SUBCASE("index out of range") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const std::uint32_t bad = 100;
      std::memcpy(at(g, 2, 24 + 4), &bad, 4);
    };
    expect_parse_error(run, "index", "rank 2 was rejected: entry 1 has index 100, outside the selection range [0, 100)");
    // nothing lost: the residual holds the whole gradient again, the pool was not overwritten
    for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == static_cast<float>(i));
    CHECK(ex.pool_data()[99] == 99.0f);
  }
  SUBCASE("count above k") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const std::uint64_t c = 11;
      std::memcpy(at(g, 1, 0), &c, 8);
    };
    expect_parse_error(run, "count", "claims 11 entries, more than the capacity k = 10");
  }
  SUBCASE("duplicate index") {
    t.edit = [&](unsigned char* g, std::size_t) { std::memcpy(at(g, 3, 24 + 8), at(g, 3, 24 + 4), 4); };
    expect_parse_error(run, "index", "a duplicate or out-of-order index");
  }
  SUBCASE("NaN value") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const float nan = std::nanf("");
      std::memcpy(at(g, 0, 24 + k * 4 + 8), &nan, 4);
    };
    expect_parse_error(run, "value", "has a NaN value");
  }
}

TEST_CASE("bad input: GTopK rejects a malformed received message, marks what it sends on, and every rank stops") {
  auto l = Layout::from_sizes({100});
  const std::size_t k = 10, mb = 24 + k * 8;
  using E = Exchanger<Sparsifier<GTopK<0.1>>>;
  auto msg = [&](std::vector<std::uint32_t> idx, std::vector<float> val, gflow::detail::sparse_message::header h = {}) {
    std::vector<unsigned char> m(mb);
    gflow::detail::sparse_message::pack(m.data(), k, idx.data(), val.data(), idx.size(), h);
    return m;
  };
  SUBCASE("rank 0 of 6 rejects rank 2's message in round 1") {
    mock::transport m(6, 0);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({1, 2}, {1.0f, 2.0f}));      // round 0, from 1: fine
    m.calls().inbox.push_back(msg({5, 300}, {1.0f, 2.0f}));    // round 1, from 2: index 300 of [0, 100)
    m.calls().inbox.push_back(msg({7}, {1.0f}));               // round 2, from 4: fine
    for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = 0.5f * static_cast<float>(i);
    expect_parse_error([&] { ex.ready(0); }, "index", "in merge round 1, rank 0 rejected the message from rank 2 (its index): entry 1 has index 300");
    // every round still ran (no peer is left waiting), the broadcast carried the mark
    CHECK(m.calls().of(mock::op::recv).size() == 3);
    CHECK(m.calls().of(mock::op::broadcast).size() == 1);
    for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == 0.5f * static_cast<float>(i));
  }
  SUBCASE("rank 4 of 6 rejects rank 5's NaN and marks its message to rank 0") {
    mock::transport m(6, 4);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({3}, {std::nanf("")}));
    // the mock's broadcast leaves the buffer: feed the mark back as rank 0 would broadcast it
    expect_parse_error([&] { ex.ready(0); }, "value", "rank 4 rejected the message from rank 5");
    const auto sends = m.calls().of(mock::op::send);
    REQUIRE(sends.size() == 1);
    CHECK(sends[0].peer == 0);
  }
  SUBCASE("a rank told by the broadcast that another rank rejected a message") {
    mock::transport m(6, 0);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({}, {}, gflow::detail::sparse_message::header{0, 3, 2, 3, 0}));  // rank 2 found a duplicate from rank 3
    expect_parse_error([&] { ex.ready(0); }, "index", "in merge round 0, rank 2 rejected the message from rank 3 (its index)");
  }
  SUBCASE("count above k from a peer") {
    mock::transport m(2, 0);
    on_mock<E> ex(m, l);
    auto bad = msg({1}, {1.0f});
    const std::uint64_t c = 99;
    std::memcpy(bad.data(), &c, 8);
    m.calls().inbox.push_back(bad);
    expect_parse_error([&] { ex.ready(0); }, "count", "claims 99 entries");
  }
}

namespace {
// In-process transport whose rank `culprit` corrupts the first index of every sparse message it sends.
class corrupting_transport : public inproc::transport {
 public:
  corrupting_transport(inproc::transport t, int culprit) : inproc::transport(std::move(t)), culprit_(culprit) {}
  template <wire_element E>
  void send(const E* buf, std::size_t n, int peer) {
    if constexpr (std::is_same_v<E, std::uint8_t>) {
      if (rank() == culprit_ && n > 28) {
        std::vector<unsigned char> copy(buf, buf + n);
        const std::uint32_t bad = 1u << 30;
        std::memcpy(copy.data() + 24, &bad, 4);
        inproc::transport::send(copy.data(), n, peer);
        return;
      }
    }
    inproc::transport::send(buf, n, peer);
  }
  corrupting_transport split(int color, int key) { return corrupting_transport(inproc::transport::split(color, key), culprit_); }

 private:
  int culprit_;
};
static_assert(gflow::transport<corrupting_transport>);
}  // namespace

TEST_CASE("in-process: a corrupt message deep in the tree stops EVERY rank with the same typed error, no hang") {
  auto l = Layout::from_sizes({100});
  for (int P : {8, 6}) {
    CAPTURE(P);
    std::vector<std::string> errors(static_cast<std::size_t>(P));
    std::vector<std::string> subjects(static_cast<std::size_t>(P));
    inproc::run(
        P,
        [&](inproc::transport& base) {
          corrupting_transport t(base, 3);  // rank 3 sends to rank 2 in round 0
          typename Exchanger<Sparsifier<GTopK<0.1>>>::template on<corrupting_transport> ex(t, l);
          for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = static_cast<float>(i + 1);
          try {
            ex.ready(0);
          } catch (const gflow::parse_error& e) {
            errors[static_cast<std::size_t>(t.rank())] = e.what();
            subjects[static_cast<std::size_t>(t.rank())] = e.subject();
          }
          // nothing lost: each rank's whole gradient is back in its residual
          for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == static_cast<float>(i + 1));
        },
        std::chrono::seconds(20));
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      CHECK(subjects[r] == "index");
      CHECK(errors[r].find("in merge round 0, rank 2 rejected the message from rank 3 (its index)") != std::string::npos);
    }
    CHECK(errors[2].find("has index 1073741824, outside the selection range [0, 100)") != std::string::npos);
  }
}

// ---- no allocation per iteration --------------------------------------------------------------

namespace gflow_test {  // the counting operator new of test_exchanger.cpp
extern std::atomic<bool> g_counting;
extern std::atomic<long> g_allocs;

/// Heap allocations made by `iters` iterations of ex (every tensor ready in layout order, then
/// finish), with the mock's call log reserved first.
template <class Ex>
long allocations_in(Ex& ex, gflow::mock::transport& m, const gflow::Layout& l, int iters) {
  m.calls().records.reserve(10000);
  g_allocs = 0;
  g_counting = true;
  for (int it = 0; it < iters; ++it) {
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
  }
  g_counting = false;
  return g_allocs.load();
}
}  // namespace gflow_test

TEST_CASE_TEMPLATE("an iteration allocates nothing (mock transport, reserved log), schedules and index widths included", S, TopK<0.02>, GTopK<0.02>) {
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77, 512});
  auto count_iterations = [&](auto& ex, mock::transport& m, int iters) { return gflow_test::allocations_in(ex, m, l, iters); };
  {
    mock::transport m(6, 0);
    on_mock<Exchanger<Sparsifier<S>, Fusion<4096>, Precision<half>>> ex(m, l);
    CHECK(count_iterations(ex, m, 5) == 0);
  }
  {
    mock::transport m(5, 4);
    on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
    ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{2, 0.3}, {4, 0.05}}, 0.01));  // k changes: no allocation
    CHECK(count_iterations(ex, m, 6) == 0);
    ex.sparsifier().set_index_bytes(8);
    CHECK(count_iterations(ex, m, 2) == 0);
  }
}

TEST_CASE_TEMPLATE("an iteration allocates nothing on the one-pass path either (units above the sampling size)", S, TopK<0.01>, GTopK<0.01>) {
  auto l = Layout::from_sizes({1000, 40000, 257, 30000, 77});
  auto count_iterations = [&](auto& ex, mock::transport& m, int iters) { return gflow_test::allocations_in(ex, m, l, iters); };
  {
    mock::transport m(6, 0);
    on_mock<Exchanger<Sparsifier<S>, Fusion<80000>, Precision<half>>> ex(m, l);
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(0, 0, i, 0);
    CHECK(count_iterations(ex, m, 3) == 0);
    CHECK(ex.sparsifier().paths().candidates > 0);
  }
  {
    mock::transport m(5, 4);
    on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(0, 1, i, 1);
    ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{2, 0.6}, {4, 0.05}}, 0.001));  // 0.6: not sampled; then sampled
    CHECK(count_iterations(ex, m, 6) == 0);
    CHECK(ex.sparsifier().paths().candidates == 1);
  }
}
