// The error catalogue (docs/ERRORS.md), one row per misuse the library detects at run time.
// Each case checks the whole contract of a gflow error: the type (class and errc), the subject
// (the parameter or operation), the "gflow: <kind> in '<subject>': " prefix, a distinctive part of
// the WHAT and of the FIX. Case ids (E01...) are the catalogue's; keep the two in step.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/layout.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/detail/plan/chunks.hpp>
#include <gflow/detail/plan/density.hpp>
#include <gflow/detail/plan/groups.hpp>
#include <gflow/detail/plan/tree.hpp>
#include <gflow/reshard.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <sstream>
#include <functional>
#include <latch>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_mock;

namespace {

struct error_case {
  const char* id;
  errc code;
  std::string subject;
  std::vector<std::string> texts;  // each must appear in what(); put one piece of the fix here too
  std::function<void()> fn;
};

// The class that matches the code, so a catch of the documented type would see the error.
bool has_class(const gflow::error& e) {
  switch (e.code()) {
    case errc::invalid_argument: return dynamic_cast<const gflow::invalid_argument*>(&e) != nullptr;
    case errc::usage: return dynamic_cast<const usage_error*>(&e) != nullptr;
    case errc::mismatch: return dynamic_cast<const mismatch_error*>(&e) != nullptr;
    case errc::transport: return dynamic_cast<const transport_error*>(&e) != nullptr;
    case errc::timeout: return dynamic_cast<const timeout_error*>(&e) != nullptr;
    case errc::parse: return dynamic_cast<const parse_error*>(&e) != nullptr;
  }
  return false;
}

// Checks one caught error against its row.
void check_error(const error_case& c, const gflow::error& e) {
  const std::string what = e.what();
  INFO(c.id << ": " << what);
  CHECK(e.code() == c.code);
  CHECK(has_class(e));
  CHECK(e.subject() == c.subject);
  CHECK(what.rfind("gflow: " + std::string(to_string(c.code)) + " in '" + c.subject + "': ", 0) == 0);
  CHECK(what.find(" Fix: ") != std::string::npos);
  for (const auto& t : c.texts) CHECK_MESSAGE(what.find(t) != std::string::npos, "missing: " << t);
}

void run_case(const error_case& c) {
  try {
    c.fn();
    FAIL_CHECK(c.id << ": expected a gflow error in '" << c.subject << "'");
  } catch (const gflow::error& e) {
    check_error(c, e);
  } catch (const std::exception& e) {
    FAIL_CHECK(c.id << ": expected a gflow error, got: " << e.what());
  }
}

void run_table(const std::vector<error_case>& table) {
  for (const auto& c : table) {
    INFO(c.id);
    run_case(c);
  }
}

// Runs fn on `ranks` in-process ranks with a short timeout and checks that EVERY rank threw the
// error of case c (a rank that returns normally fails the case).
void run_inproc_case(const error_case& c, int ranks, const std::function<void(inproc::transport&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(300)) {
  std::mutex mu;
  std::vector<std::string> got(static_cast<std::size_t>(ranks));
  inproc::run(
      ranks,
      [&](inproc::transport& t) {
        try {
          fn(t);
          std::lock_guard lk(mu);
          got[static_cast<std::size_t>(t.rank())] = "no error";
        } catch (const gflow::error& e) {
          std::lock_guard lk(mu);
          check_error(c, e);
          got[static_cast<std::size_t>(t.rank())] = "ok";
        }
      },
      timeout);
  for (int r = 0; r < ranks; ++r) CHECK_MESSAGE(got[static_cast<std::size_t>(r)] == "ok", c.id << ": rank " << r << ": " << got[static_cast<std::size_t>(r)]);
}

}  // namespace

// ---- layout: the .tsv parser and the tensor list ---------------------------------------------------

TEST_CASE("errors: layout files and tensor lists (E01-E13)") {
  const std::size_t big = std::size_t{1} << 62;  // 2^62: four of them wrap a 64-bit count
  const std::string huge = std::to_string(big);
  run_table({
      {"E01", errc::parse, "m.tsv:2", {"expected 3 tab-separated columns (name, shape, numel), found 2.", "Fix: write 'name<TAB>shape<TAB>numel'"},
       [] { (void)Layout::parse_tsv("a\t2\t2\nb\t2\n", "m.tsv"); }},
      {"E02", errc::parse, "m.tsv:1", {"more than 3 tab-separated columns.", "Fix: write 'name<TAB>shape<TAB>numel'."},
       [] { (void)Layout::parse_tsv("a\t2\t2\tx\n", "m.tsv"); }},
      {"E03", errc::parse, "m.tsv:1", {"empty tensor name.", "Fix: give every row a name in column 1."},
       [] { (void)Layout::parse_tsv("\t2\t2\n", "m.tsv"); }},
      {"E04", errc::parse, "m.tsv:1", {"empty shape field.", "Fix: write a non-negative integer."},
       [] { (void)Layout::parse_tsv("a\t3x\t3\n", "m.tsv"); }},
      {"E05", errc::parse, "m.tsv:3", {"numel field '12a' is not a non-negative integer.", "Fix: write digits only"},
       [] { (void)Layout::parse_tsv("# comment\na\t3\t3\nb\t12\t12a\n", "m.tsv"); }},
      {"E06", errc::parse, "m.tsv:1", {"shape value overflows.", "Fix: check the number."},
       [] { (void)Layout::parse_tsv("a\t99999999999999999999\t1\n", "m.tsv"); }},
      {"E07", errc::parse, "m.tsv:1", {"shape product overflows.", "Fix: check the shape column."},
       [] { (void)Layout::parse_tsv("a\t4294967296x4294967296\t1\n", "m.tsv"); }},
      {"E08", errc::parse, "m.tsv:1", {"numel 7 does not match the shape's product 6.", "Fix: make column 3 the product"},
       [] { (void)Layout::parse_tsv("a\t2x3\t7\n", "m.tsv"); }},
      {"E09", errc::parse, "m.tsv", {"the layout file holds no tensor rows.", "Fix: add rows"},
       [] { (void)Layout::parse_tsv("# only a comment\n\n", "m.tsv"); }},
      {"E10", errc::invalid_argument, "layout path", {"cannot open '/nonexistent/model.tsv'.", "Fix: pass an existing .tsv file"},
       [] { (void)Layout::from_tsv("/nonexistent/model.tsv"); }},
      {"E11", errc::invalid_argument, "layout", {"the layout is empty", "Fix: describe at least one tensor."},
       [] { (void)Layout::from_sizes(std::vector<std::size_t>{}); }},
      {"E12", errc::invalid_argument, "layout", {"tensor 1 ('b') has zero elements.", "Fix: leave tensors without gradients out"},
       [] { (void)Layout::parse_tsv("a\t2\t2\nb\t0x5\t0\n"); }},
      // A bug found with fuzz_layout_tsv's invariants: tensors of 2^62 elements parsed and the
      // pool's element count wrapped around. The layout now refuses a pool whose bytes cannot be
      // one array (corpus: tests/fuzz/corpus/fuzz_layout_tsv/regression_total_overflow).
      {"E13", errc::invalid_argument, "layout", {"tensor 0 ('a') brings the pool to more than", "Fix: describe the tensors of one model"},
       [&] { (void)Layout::parse_tsv("a\t" + huge + "\t" + huge + "\nb\t" + huge + "\t" + huge + "\n"); }},
  });
}

// ---- the exchanger's iteration protocol ------------------------------------------------------------

TEST_CASE("errors: the exchanger's iteration protocol (E14-E19)") {
  const auto l = Layout::from_sizes({3, 5});
  mock::transport m(2);
  run_table({
      {"E14", errc::usage, "ready", {"tensor 1 ('t1') was marked ready twice in iteration 0.", "Fix: call ready(i) once per tensor per iteration"},
       [&] {
         on_mock<Exchanger<>> ex(m, l);
         ex.ready(1);
         ex.ready(1);
       }},
      {"E15", errc::invalid_argument, "source", {"ready(0, source) got 4 elements; tensor 0 ('t0') has 3.", "Fix: pass a span of exactly"},
       [&] {
         on_mock<Exchanger<>> ex(m, l);
         const std::vector<float> g(4, 1.0f);
         ex.ready(0, g);
       }},
      {"E16", errc::usage, "finish", {"1 of 2 tensors are not ready in iteration 0; the first is tensor 0 ('t0').", "Fix: call ready(i) for every tensor"},
       [&] {
         on_mock<Exchanger<>> ex(m, l);
         ex.ready(1);
         (void)ex.finish();
       }},
      {"E17", errc::usage, "set_fusion", {"called in the middle of iteration 0.", "Fix: change the fusion threshold between finish() and the next ready()."},
       [&] {
         on_mock<Exchanger<Fusion<64>>> ex(m, l);
         ex.ready(1);
         ex.set_fusion(128);
       }},
      {"E18", errc::invalid_argument, "threshold_bytes", {"the fusion threshold must be positive (got 0).", "Fix: pass a byte count such as 4 << 20"},
       [&] {
         on_mock<Exchanger<Fusion<64>>> ex(m, l);
         ex.set_fusion(0);
       }},
      {"E19", errc::invalid_argument, "tensor", {"view(2): index out of range; the layout has 2 tensors.", "Fix: pass a layout index in [0, 2)"},
       [&] {
         on_mock<Exchanger<>> ex(m, l);
         (void)ex.view(2);
       }},
  });
}

// ---- planners ----------------------------------------------------------------------------------------

TEST_CASE("errors: planners (E20-E37)") {
  const auto l = Layout::from_sizes({10, 10});
  const auto pool = gflow::detail::plan::plan_pool(l);
  run_table({
      {"E20", errc::invalid_argument, "wire_bytes_per_element", {"must be positive.", "Fix: pass the size of the wire type."},
       [&] { (void)gflow::detail::plan::plan_buckets(l, pool, {0, 0, 0}); }},
      {"E21", errc::invalid_argument, "chunk_elems", {"the CSC chunk size must be positive (got 0).", "Fix: pass a chunk size in elements such as 32768"},
       [] { gflow::detail::plan::chunk_geometry g(100, 0); }},
      {"E22", errc::invalid_argument, "pool_elems", {"the pool to cut into chunks is empty.", "Fix: describe at least one non-empty tensor"},
       [] { gflow::detail::plan::chunk_geometry g(0, 8); }},
      {"E23", errc::invalid_argument, "chunk_elems", {"chunk indices are 32-bit.", "Fix: use a chunk size of at least 3 elements."},
       [] { gflow::detail::plan::chunk_geometry g(std::size_t{1} << 33, 1); }},
      {"E24", errc::invalid_argument, "buckets", {"the buckets cover 20 pool elements, the chunk geometry 30.", "Fix: plan the chunks and the buckets over the same pool."},
       [&] { (void)gflow::detail::plan::plan_chunk_ranges(gflow::detail::plan::chunk_geometry(30, 8), gflow::detail::plan::plan_buckets(l, pool, {})); }},
      {"E25", errc::invalid_argument, "buckets", {"bucket at pool offset 10 does not follow the previous one (expected offset 0).", "Fix: pass the buckets of plan_buckets"},
       [&] {
         auto b = gflow::detail::plan::plan_buckets(l, pool, {});
         std::swap(b[0], b[1]);
         (void)gflow::detail::plan::plan_chunk_ranges(gflow::detail::plan::chunk_geometry(20, 8), b);
       }},
      {"E26", errc::invalid_argument, "ranks", {"a group plan needs at least one rank (got 0).", "Fix: pass the transport's size()"},
       [] { (void)gflow::detail::plan::plan_groups(0, 1); }},
      {"E27", errc::invalid_argument, "group_size", {"the hierarchical group size must be positive (got 0).", "Fix: pass the number of ranks per group"},
       [] { (void)gflow::detail::plan::plan_groups(4, 0); }},
      {"E28", errc::invalid_argument, "group_size", {"the hierarchical group size 5 exceeds the 4 ranks of the transport.", "or use Topology<Ring> on this few ranks."},
       [] { (void)gflow::detail::plan::plan_groups(4, 5); }},
      {"E29", errc::invalid_argument, "rank", {"rank 6 is outside the 6 ranks of the group plan.", "Fix: pass a rank in [0, 6)."},
       [] { (void)gflow::detail::plan::plan_groups(6, 4).group_of(6); }},
      {"E30", errc::invalid_argument, "group", {"group 2 does not exist; the plan has 2 groups.", "Fix: pass a group index in [0, 2)."},
       [] { (void)gflow::detail::plan::plan_groups(6, 4).size_of(2); }},
      {"E31", errc::invalid_argument, "density", {"the density must lie in (0, 1] (got 0.000000).", "Fix: pass the fraction of gradients to exchange"},
       [] { (void)gflow::detail::plan::k_for(0.0, 10); }},
      {"E32", errc::invalid_argument, "steps[1].until", {"warm-up step 1 ends at iteration 10, not after the previous step's end (10).", "Fix: give each step an end iteration strictly greater"},
       [] { (void)gflow::detail::plan::density_schedule::per_iteration({{10, 0.5}, {10, 0.25}}, 0.1); }},
      {"E33", errc::invalid_argument, "iterations_per_epoch", {"an epoch must hold at least one iteration (got 0).", "Fix: pass the number of exchanger iterations"},
       [] { (void)gflow::detail::plan::density_schedule::gtopk_warmup(0); }},
      {"E34", errc::invalid_argument, "iterations_per_epoch", {"the warm-up would end past 2^64 iterations.", "Fix: pass a smaller number of iterations per epoch."},
       [] { (void)gflow::detail::plan::density_schedule::gtopk_warmup(std::numeric_limits<std::uint64_t>::max() / 2); }},
      {"E35", errc::invalid_argument, "ranks", {"gTop-k needs at least one rank (got 0).", "Fix: pass the group size, >= 1."},
       [] { (void)gflow::detail::plan::gtopk_rounds(0); }},
      {"E36", errc::invalid_argument, "rank", {"rank 6 is outside the group of 6 ranks.", "Fix: pass 0 <= rank < ranks."},
       [] { (void)gflow::detail::plan::gtopk_step(6, 6, 0); }},
      {"E37", errc::invalid_argument, "round", {"round 3 is outside [0, 3) for 6 ranks.", "Fix: pass 0 <= round < ceil(log2 ranks)."},
       [] { (void)gflow::detail::plan::gtopk_step(0, 6, 3); }},
  });
}

// ---- policies: sparsifiers, topology, optimizer ---------------------------------------------------------

TEST_CASE("errors: sparsifier, topology and optimizer settings (E38-E55)") {
  const auto l = Layout::from_sizes({30, 30});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> csc(m, l);
  on_mock<Exchanger<Sparsifier<TopK<0.1>>>> topk(m, l);
  optim::momentum_sgd opt(60, 0.1f, 0.9f);
  std::vector<float> w(60), g(60);
  const std::vector<std::uint32_t> sel{0, 2};
  run_table({
      {"E38", errc::invalid_argument, "density", {"the density must lie in (0, 1] (got 1.500000).", "1 exchanges everything."},
       [&] { topk.sparsifier().set_density(1.5); }},
      {"E39", errc::invalid_argument, "index_bytes", {"indices travel as 4 or 8 bytes (got 2).", "Fix: pass 4 or 8."},
       [&] { topk.sparsifier().set_index_bytes(2); }},
      {"E40", errc::invalid_argument, "final_density", {"the density must lie in (0, 1] (got nan)", "Fix: pass the fraction"},
       [&] { (void)gflow::detail::plan::density_schedule::constant(std::nan("")); }},
      {"E41", errc::invalid_argument, "percent", {"the percent of CSC chunks exchanged must lie in (0, 100] (got 101).", "Fix: pass e.g. 15"},
       [&] { csc.sparsifier().set_percent(101); }},
      {"E42", errc::invalid_argument, "momentum", {"the CSC momentum must lie in [0, 1] (got 1.500000).", "Fix: pass the optimizer's momentum"},
       [&] { csc.sparsifier().set_momentum(1.5f); }},
      {"E43", errc::invalid_argument, "ramp", {"iterations is longer than supported", "Fix: pass a ramp of at most 2^32 iterations."},
       [&] { csc.sparsifier().set_warmup(0, (std::uint64_t{1} << 32) + 1); }},
      {"E44", errc::usage, "exchange", {"CSC got bucket 1 where bucket 0 was next.", "Fix: exchange buckets once each, in pool order"},
       [&] {
         on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> ex(m, l);
         ex.sparsifier().exchange(1);
       }},
      {"E45", errc::usage, "end_iteration", {"CSC reached the end of the iteration after 1 of 2 buckets.", "Fix: exchange every bucket before ending the iteration"},
       [&] {
         on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> ex(m, l);
         ex.sparsifier().exchange(0);
         ex.sparsifier().end_iteration();
       }},
      {"E46", errc::usage, "set_percent", {"called in the middle of an iteration (after 1 buckets were exchanged).", "Fix: change CSC settings between finish() and the next ready()."},
       [&] {
         on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> ex(m, l);
         ex.ready(1);  // the pool's first bucket (generation order) goes out
         ex.sparsifier().set_percent(20);
       }},
      {"E47", errc::invalid_argument, "threshold_bytes", {"the Hybrid threshold must be positive (got 0)", "Fix: pass the message size in bytes where ring starts to win"},
       [&] {
         mock::transport one(1);
         Hybrid<64, 1>::engine<mock::transport> e(one);
         e.set_threshold(0);
       }},
      {"E48", errc::invalid_argument, "group_size", {"the hierarchical group size 5 exceeds the 2 ranks of the transport.", "Fix: pass a group size between 1 and 2"},
       [&] { Exchanger<Topology<Hierarchical<5>>>::on<mock::transport> ex(m, l); }},
      {"E49", errc::invalid_argument, "learning_rate", {"the learning rate must be finite and non-negative (got -1.000000).", "Fix: pass e.g. 0.1"},
       [] { optim::momentum_sgd o(10, -1.0f, 0.9f); }},
      {"E50", errc::invalid_argument, "momentum", {"the SGD momentum must lie in [0, 1) (got 1.000000).", "Fix: pass e.g. 0.9."},
       [] { optim::momentum_sgd o(10, 0.1f, 1.0f); }},
      {"E51", errc::invalid_argument, "chunk_elems", {"the chunk size must be positive (got 0).", "Fix: pass the exchanger's ex.sparsifier().chunk_elems()."},
       [&] { opt.step(w, g, sel, 0); }},
      {"E52", errc::invalid_argument, "selected", {"chunk 8 is outside the pool's 8 chunks of 8 elements.", "Fix: pass ex.sparsifier().selected_chunks()"},
       [&] { opt.step(w, g, std::vector<std::uint32_t>{1, 8}, 8); }},
      {"E53", errc::invalid_argument, "selected", {"the chunk list is not strictly ascending at position 1.", "(ascending, no duplicates)."},
       [&] { opt.step(w, g, std::vector<std::uint32_t>{2, 2}, 8); }},
      {"E54", errc::invalid_argument, "gradients", {"the weights have 10 elements, the gradients 9.", "Fix: pass the weights and gradients of the same tensor"},
       [&] { opt.step_all(std::span<float>(w).first(10), std::span<const float>(g).first(9)); }},
      {"E55", errc::invalid_argument, "pool_offset", {"range [55, 65) is outside the pool of 60 elements.", "Fix: pass the tensor's offset from ex.pool_plan().offset"},
       [&] { opt.step_all(std::span<float>(w).first(10), std::span<const float>(g).first(10), 55); }},
  });
}

// ---- transports: arguments, the mock, the in-process transport's fault detection --------------------

TEST_CASE("errors: transports (E56-E62)") {
  run_table({
      {"E58", errc::invalid_argument, "size", {"a mock group needs at least one rank.", "Fix: pass size >= 1."}, [] { mock::transport m(0); }},
      {"E59", errc::invalid_argument, "rank", {"rank outside [0, size).", "Fix: pass 0 <= rank < size."}, [] { mock::transport m(2, 2); }},
      {"E60", errc::mismatch, "recv", {"mock inbox payload has 3 bytes, recv expects 4.", "Fix: queue a payload of the size"},
       [] {
         mock::transport m(2);
         m.calls().inbox.push_back(std::vector<unsigned char>(3, 0));
         float v = 0;
         m.recv(&v, 1, 1);
       }},
      {"E61", errc::invalid_argument, "ranks", {"must be at least 1.", "Fix: pass a positive number of ranks."},
       [] { inproc::run(0, [](inproc::transport&) {}); }},
  });

  // Peer and root checks (the same detail::check_peer_rank in the MPI, NCCL and in-process transports).
  run_inproc_case({"E56", errc::invalid_argument, "root", {"root 2 is outside the group of 2 ranks.", "Fix: pass a rank in [0, size())."}, {}}, 2,
                  [](inproc::transport& t) {
                    float v = 0;
                    t.broadcast(&v, 1, 2);
                  });
  run_inproc_case({"E57", errc::invalid_argument, "peer", {"peer -1 is outside the group of 2 ranks.", "Fix: pass a rank in [0, size())."}, {}}, 2,
                  [](inproc::transport& t) {
                    float v = 0;
                    t.send(&v, 1, -1);
                  });
  // In-process faults: every rank involved gets the error, within the timeout (never a hang).
  run_inproc_case({"E62", errc::mismatch, "all_reduce", {"rank 1: all_reduce(8 x f32, sum)", "Fix: make every rank describe the same layout"}, {}}, 3,
                  [](inproc::transport& t) {
                    std::vector<float> v(t.rank() == 1 ? 8 : 4, 1.0f);
                    t.all_reduce(v.data(), v.size(), reduce_op::sum);
                  });
}

TEST_CASE("errors: the in-process transport's timeouts and point-to-point faults (E63-E67)") {
  // E63: a rank that does not arrive at a collective in time; the others name it. E67: when it
  // arrives later, the collective the others abandoned is refused rather than run half-empty.
  {
    const error_case c{"E63", errc::timeout, "all_reduce", {"rank(s) 2 did not arrive", "Fix: make every rank issue the same collectives in the same order, or raise the timeout."}, {}};
    const error_case late{"E67", errc::timeout, "all_reduce", {"gave up on collective #0 after a timeout in group 'world'; this collective was not executed.", "or raise the timeout."}, {}};
    // The order is explicit, not raced against a sleep: rank 2 enters the collective only after
    // ranks 0 and 1 have both given up on it (each waits the whole timeout from its own arrival).
    std::atomic<int> seen{0};
    std::latch gave_up(2);
    inproc::run(
        3,
        [&](inproc::transport& t) {
          if (t.rank() == 2) gave_up.wait();
          float v = 1;
          try {
            t.all_reduce(&v, 1, reduce_op::sum);
          } catch (const gflow::error& e) {
            check_error(t.rank() == 2 ? late : c, e);
            ++seen;
          }
          if (t.rank() != 2) gave_up.count_down();
        },
        std::chrono::milliseconds(200));
    CHECK(seen == 3);
  }
  // E64 / E65: recv of the wrong size, then a recv nobody sends.
  {
    const error_case wrong{"E64", errc::mismatch, "recv", {"rank 1 expected 3 x f32 from rank 0 but got 2 x f32.", "Fix: make send and recv agree on count and element type."}, {}};
    const error_case never{"E65", errc::timeout, "recv", {"ms for a message from rank 0 that was never sent.", "Fix: pair every recv with a send on the peer, or raise the timeout."}, {}};
    std::atomic<int> seen{0};
    inproc::run(
        2,
        [&](inproc::transport& t) {
          if (t.rank() == 0) {
            const float v[2] = {1, 2};
            t.send(v, 2, 1);
            return;
          }
          float v[3];
          for (const error_case* c : {&wrong, &never}) {
            try {
              t.recv(v, 3, 0);
            } catch (const gflow::error& e) {
              check_error(*c, e);
              ++seen;
            }
          }
        },
        std::chrono::milliseconds(200));
    CHECK(seen == 2);
  }
  // E66: waiting twice on one request.
  {
    const error_case c{"E66", errc::usage, "wait", {"the request was already completed.", "Fix: wait on each request once."}, {}};
    std::atomic<int> seen{0};
    inproc::run(2, [&](inproc::transport& t) {
      float v = 1;
      auto r = t.iall_reduce(&v, 1, reduce_op::sum);
      auto copy = r;
      t.wait(r);
      t.barrier();  // both ranks have waited: the request is gone
      try {
        t.wait(copy);
      } catch (const gflow::error& e) {
        check_error(c, e);
        ++seen;
      }
    });
    CHECK(seen == 2);
  }
}

// ---- replicas: broadcast_parameters and verify_replicas (replicas.hpp) --------------------------------

TEST_CASE("errors: broadcast_parameters and verify_replicas (E68-E73)") {
  const Layout l = Layout::from_sizes({6, 4});
  const std::string raised = "Raised on rank ";
  // E68: values.size() is not the layout's element count: on one rank (every rank raises), or alone.
  const error_case e68{"E68", errc::invalid_argument, "values",
                       {"verify_replicas: rank 1 passed 9 values; its layout holds 10 elements in 2 tensors; ranks whose count is wrong: 1.", raised,
                        "Fix: pass the span of all the parameters and buffers the layout describes, layout.total_numel() floats"},
                       {}};
  run_inproc_case(e68, 3, [&](inproc::transport& t) {
    std::vector<float> v(t.rank() == 1 ? 9 : 10, 1.0f);
    verify_replicas(t, v, l);
  });
  run_table({{"E68", errc::invalid_argument, "values", {"verify_replicas: rank 0 passed 11 values; its layout holds 10 elements in 2 tensors.", "Raised on rank 0 of 1."},
              [&] {
                mock::transport solo(1, 0);
                std::vector<float> v(11);
                verify_replicas(solo, v, l);
              }}});
  // E69: the ranks pass different layouts.
  run_inproc_case({"E69", errc::mismatch, "layout",
                   {"verify_replicas: the ranks pass different layouts (layout fingerprint of names, shapes and order; 2 tensors on rank 0, 3 on rank 2); "
                    "ranks whose layout differs from rank 0's: 2.",
                    "Fix: pass the same Layout on every rank"},
                   {}},
                  3, [&](inproc::transport& t) {
                    const Layout mine = t.rank() == 2 ? Layout::from_sizes({6, 2, 2}) : l;
                    std::vector<float> v(10, 1.0f);
                    verify_replicas(t, v, mine);
                  });
  // E70: the replicas differ (tests/test_replicas.cpp checks the variants of the text).
  run_inproc_case({"E70", errc::mismatch, "values",
                   {"verify_replicas: the replicas differ in 1 of 2 tensors. The first is tensor 1 (layout index) 't1' [4] (4 elements): "
                    "ranks that differ from rank 0 there: 2; ranks that differ from the majority (2 of 3 ranks, rank 0 among them): 2. "
                    "Ranks whose values differ from rank 0's in any tensor: 2.",
                    raised, "Fix: start every rank from the same values (gflow::broadcast_parameters from one rank", "broadcast the values of a good rank again."},
                   {}},
                  3, [&](inproc::transport& t) {
                    std::vector<float> v(10, 1.0f);
                    if (t.rank() == 2) v[7] = std::nextafter(1.0f, 2.0f);
                    verify_replicas(t, v, l);
                  });
  // E71: a root outside the group, named by one rank only: every rank raises.
  const error_case e71{"E71", errc::invalid_argument, "root",
                       {"broadcast_parameters: root 3 is outside the group of 3 ranks.", "Fix: pass the rank whose values every rank takes, in [0, 3); usually 0."},
                       {}};
  run_inproc_case(e71, 3, [&](inproc::transport& t) {
    std::vector<float> v(10, 1.0f);
    broadcast_parameters(t, v, t.rank() == 1 ? 3 : 0);
  });
  run_table({{"E71", errc::invalid_argument, "root", {"broadcast_parameters: root -1 is outside the group of 1 ranks.", "in [0, 1); usually 0."},
              [&] {
                mock::transport solo(1, 0);
                std::vector<float> v(3);
                broadcast_parameters(solo, v, -1);
              }}});
  // E72: the ranks name different roots (each inside the group).
  run_inproc_case({"E72", errc::mismatch, "root",
                   {"broadcast_parameters: the ranks name different roots: rank 0 names 0, rank 2 names 1; ranks whose root differs from rank 0's: 2.", raised,
                    "Fix: pass the same root on every rank."},
                   {}},
                  3, [&](inproc::transport& t) {
                    std::vector<float> v(10, 1.0f);
                    broadcast_parameters(t, v, t.rank() == 2 ? 1 : 0);
                  });
  // E73: the ranks pass different element counts (an MPI broadcast would truncate or hang).
  run_inproc_case({"E73", errc::mismatch, "values",
                   {"broadcast_parameters: the ranks pass different element counts: the root, rank 1, passes 10, rank 0 passes 8; "
                    "ranks whose count differs from the root's: 0.",
                    raised, "Fix: pass the same parameter vector (the same model, all its parameters and buffers) on every rank."},
                   {}},
                  2, [&](inproc::transport& t) {
                    std::vector<float> v(t.rank() == 0 ? 8 : 10, 1.0f);
                    broadcast_parameters(t, v, 1);
                  });
}

TEST_CASE("errors: re-sharding checkpoints (E74-E84)") {
  using E = Exchanger<Sparsifier<TopK<0.1>>>;
  const Layout l = Layout::from_sizes({40, 24});
  auto save_set = [&](int P, int k) {
    std::vector<std::string> out(static_cast<std::size_t>(P));
    inproc::run(P, [&](inproc::transport& t) {
      typename E::template on<inproc::transport> ex(t, l);
      for (int it = 0; it < k; ++it) {
        for (std::size_t i = 0; i < l.size(); ++i)
          for (float& v : ex.view(i)) v = float(t.rank() + 1) * 0.25f;
        for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
        (void)ex.finish();
      }
      std::ostringstream os(std::ios::binary);
      ex.save_state(os);
      out[std::size_t(t.rank())] = os.str();
    });
    return out;
  };
  const auto set3 = save_set(3, 2), later = save_set(3, 3), set2 = save_set(2, 2);
  const auto csc = [&] {
    std::vector<std::string> out(1);
    inproc::run(1, [&](inproc::transport& t) {
      Exchanger<Sparsifier<CSC<16, 25>>>::on<inproc::transport> ex(t, l);
      std::ostringstream os(std::ios::binary);
      ex.save_state(os);
      out[0] = os.str();
    });
    return out[0];
  }();
  auto reshard = [](std::vector<std::string> files, int rank = 0, int size = 2) {
    std::vector<std::unique_ptr<std::istringstream>> own;
    std::vector<std::istream*> p;
    for (const auto& f : files) {
      own.push_back(std::make_unique<std::istringstream>(f, std::ios::binary));
      p.push_back(own.back().get());
    }
    std::ostringstream out(std::ios::binary);
    reshard_checkpoint(p, rank, size, out);
  };
  const std::filesystem::path nowhere = std::filesystem::temp_directory_path() / "gflow_errors_no_such_dir" / "x";
  run_table({
      {"E74", errc::parse, "checkpoints", {"checkpoint 1 of the set cannot be read: gflow: parse error", "truncated", "Fix: pass intact checkpoints"},
       [&] {
         auto f = set3;
         f[1].resize(f[1].size() - 9);
         reshard(f);
       }},
      {"E75", errc::invalid_argument, "checkpoints",
       {"the set holds 2 checkpoints of a job of 3 ranks; rank 1's is missing.", "Fix: pass the checkpoints of every rank"},
       [&] { reshard({set3[0], set3[2]}); }},
      {"E76", errc::invalid_argument, "checkpoints", {"rank 2 appears twice in the set (checkpoint 3 and an earlier one).", "Fix: pass each rank's checkpoint once."},
       [&] { reshard({set3[0], set3[2], set3[1], set3[2]}); }},
      {"E77", errc::mismatch, "iteration",
       {"rank 0's checkpoint was saved after iteration 2, rank 1's after iteration 3: the set mixes generations.",
        "Fix: pass checkpoints saved at the same iteration by every rank"},
       [&] { reshard({set3[0], later[1], set3[2]}); }},
      {"E78", errc::mismatch, "checkpoints", {"checkpoint 1 of the set was saved by another exchanger than checkpoint 0", "Fix: pass the checkpoints of one job only."},
       [&] { reshard({set3[0], csc, set3[2]}); }},
      {"E79", errc::invalid_argument, "checkpoints",
       {"checkpoint 2 was saved in a job of 2 ranks; checkpoint 0 in one of 3.", "Fix: pass the checkpoints of one job only."},
       [&] { reshard({set3[0], set3[1], set2[1]}); }},
      {"E80", errc::invalid_argument, "composition",
       {"re-sharding reads the sparsifier state of Dense, TopK, GTopK, OkTopK and CSC", "<gflow::Precision<>, gflow::detail::no_fusion, gflow::Sparsifier<my::RandK<8> >",
        "Fix: resume it on the same number of ranks (load_state)"},
       [&] { (void)detail::schema_of("gflow::Precision<>, gflow::detail::no_fusion, gflow::Sparsifier<my::RandK<8> >, gflow::Topology<>, gflow::Overlap<>"); }},
      {"E81", errc::invalid_argument, "new_rank", {"rank 2 of 2 is not a rank of the new job.", "Fix: pass 0 <= new_rank < new_size"},
       [&] { reshard(set3, 2, 2); }},
      {"E82", errc::invalid_argument, "root",
       {"holds no complete checkpoint set (iter-<n>/rank-<r>.gflow for every rank r).", "Fix: pass the directory save_checkpoint wrote to"},
       [&] {
         mock::transport solo(1, 0);
         on_mock<E> ex(solo, l);
         (void)load_checkpoint(ex, nowhere);
       }},
      {"E83", errc::invalid_argument, "file", {"writing the checkpoint to '", ".tmp' failed (3 bytes).", "Fix: check the directory exists"},
       [&] { write_file_atomically(nowhere, "abc"); }},
      {"E84", errc::invalid_argument, "checkpoints", {"the checkpoint file '", "' cannot be opened.", "Fix: pass the files every rank of the saving job wrote"},
       [&] {
         mock::transport solo(1, 0);
         on_mock<E> ex(solo, l);
         load_resharded(ex, std::vector<std::filesystem::path>{nowhere});
       }},
  });
}

// ---- Sparsifier<OkTopK<d>> and the variable-size collectives (issue 24) -----------------------------

TEST_CASE("errors: OkTopK parameters and the variable-size collectives (E85-E89)") {
  auto l = Layout::from_sizes({100});
  mock::transport m(2, 0);
  on_mock<Exchanger<Sparsifier<OkTopK<0.1>>>> ex(m, l);
  detail::oktopk_params zero_period;
  zero_period.threshold_period = 0;
  detail::oktopk_params bad_adapt;
  bad_adapt.local_adapt = 0.5;
  run_table({
      {"E85", errc::invalid_argument, "threshold_period", {"the threshold re-estimation period is 0.", "Fix: pass a period >= 1 (1: exact top-k every iteration)."},
       [&] { ex.sparsifier().set_params(zero_period); }},
      {"E86", errc::invalid_argument, "local_adapt", {"the local threshold's adaptation factor 0.500000 is outside [1, 2].", "Fix: pass e.g. 1.012 (1: no adaptation)."},
       [&] { ex.sparsifier().set_params(bad_adapt); }},
      {"E89", errc::mismatch, "all_to_allv", {"mock rank 0 expects 3 elements from rank 1, which (holding the same data) sends 2.", "Fix: pass receive counts that match"},
       [&] {
         std::vector<float> s(4), r(6);
         const std::size_t sc[2] = {2, 2}, rc[2] = {2, 3};
         m.all_to_allv(s.data(), sc, r.data(), rc);
       }},
  });
  // E87 / E88: in-process ranks whose counts disagree; raised on every rank, nothing copied.
  run_inproc_case({"E87", errc::mismatch, "all_to_allv", {"all_to_allv: rank 1 sends 2 elements to rank 0, which expects 1", "Fix: make every rank describe the same layout"}, {}}, 3,
                  [](inproc::transport& t) {
                    std::vector<float> s(6, 1.0f), r(6);
                    std::size_t sc[3] = {2, 2, 2}, rc[3] = {2, 2, 2};
                    if (t.rank() == 0) rc[1] = 1;
                    t.all_to_allv(s.data(), sc, r.data(), rc);
                  });
  run_inproc_case({"E88", errc::mismatch, "all_gatherv", {"all_gatherv: rank 2 contributes 3 elements, rank 0 expects 2", "Fix: make every rank describe the same layout"}, {}}, 3,
                  [](inproc::transport& t) {
                    std::vector<float> s(3, 1.0f), r(9);
                    const std::size_t c[3] = {2, 2, 2};
                    t.all_gatherv(s.data(), t.rank() == 2 ? 3 : 2, r.data(), c);
                  });
}
