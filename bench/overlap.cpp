// bench/run overlap: a simulated backward with ready() after each tensor, each Overlap strategy
// against the exchange alone (how much of the exchange the backward hides); --learn-order also
// each strategy with exchange_options::learn_order; --shard also each with Sharding<ReduceScatter>
// (the same simulated backward, calibrated on the allreduce); --autotune the fixed-threshold sweep against
// Fusion<Auto> (below).
// layering: gflow::detail::fusion_tuner and fusion_plan: --autotune reports the tuner's phase, its
// probes and the plans it chose from.
#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace gflow_bench {

namespace {

// A simulated backward: tensor k's gradient takes time proportional to its size, spent sleeping
// (the model of a backward pass running on an accelerator while the host communicates; spinning
// would fight the communication for this machine's 2 cores), then ready(k). Short waits are
// batched (a sleep is only taken once 200 us are owed) so the per-call overhead of sleeping does
// not inflate the small tensors.
struct overlap_result {
  std::string name;
  stats iteration, exchange, compute;
};

// One simulated backward with ready() after each tensor; returns the iteration's seconds and
// adds the time slept to `slept` (this rank's).
template <class X>
double simulated_backward(X& ex, const gflow::Layout& l, double per_elem_s, double& slept) {
  const double t0 = MPI_Wtime();
  double owed = 0;
  for (std::size_t j = 0; j < g_backward_order.size(); ++j) {
    const std::size_t k = g_backward_order[j];
    owed += per_elem_s * static_cast<double>(l[k].numel);
    if (owed >= 200e-6 || j + 1 == g_backward_order.size()) {
      const double s0 = MPI_Wtime();
      std::this_thread::sleep_for(std::chrono::duration<double>(owed));
      const double took = MPI_Wtime() - s0;
      slept += took;
      owed -= took;
    }
    ex.ready(k);
  }
  (void)ex.finish();
  return MPI_Wtime() - t0;
}

template <class E>
overlap_result run_overlap_variant(const char* name, const options& o, const gflow::Layout& l, double per_elem_s, bool traced = false,
                                   bool learn_order = false) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  gflow::exchange_options eo;
  eo.learn_order = learn_order;  // learns from the first iteration's order: the backward's (below)
  typename E::template on<gflow::mpi::transport> ex(tr, l, eo);
  ex.set_fusion(o.threshold);
  const std::size_t total = l.total_numel();
  std::vector<float> fresh(total, 0.5f);
  std::vector<double> it_t, ex_t, co_t;
  std::optional<gflow::timeline> tl;
  if (traced) {
    tl.emplace();
    tl->start(tr);
  }
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    // exchange alone: every gradient ready at once
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (std::size_t k : g_backward_order) ex.ready(k);
    (void)ex.finish();
    double dx = MPI_Wtime() - t0;
    // backward with the exchange overlapped
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    if (tl) ex.set_timeline(&*tl);  // the overlapped backward only
    double slept = 0;
    double di = simulated_backward(ex, l, per_elem_s, slept);
    if (tl) ex.set_timeline(nullptr);
    MPI_Allreduce(MPI_IN_PLACE, &dx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &di, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &slept, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it >= o.warmup) {
      ex_t.push_back(dx);
      it_t.push_back(di);
      co_t.push_back(slept);
    }
  }
  if (tl) {
    tl->write_chrome_trace(tr, o.trace);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "  trace of %s: %zu events on rank 0, %zu dropped, written to %s\n", name, tl->size(), tl->dropped(), o.trace.c_str());
  }
  return {name, summarize(it_t), summarize(ex_t), summarize(co_t)};
}

// ---- overlap --autotune: fixed thresholds against Fusion<Auto> ----------------------------------
// Funneled, the simulated backward only (no exchange-alone pass). First the tuner runs from 4 MiB
// until it has been settled for 10 iterations (at most 80): the iteration at which it settled.
// Then every fixed plan of the sweep and the settled tuner are timed in interleaved rounds: each
// round visits all of them in a new random order (a fixed seed, the same on every rank), one
// warm-up and 3 timed iterations each. A plan's time is the median of its timed iterations over
// all rounds, so a drift of the machine over the minutes a sweep takes lands on every plan alike
// instead of on whichever ran in that stretch (one fixed plan after another, then the tuner, made
// the same plan differ by up to 50% between a sweep and the tuner's run).
// Every visit constructs its exchanger afresh: a Fixed one at the plan, or a Fusion<Auto> one
// restored from the tuner's checkpoint (saved again after the visit). An exchanger's speed
// depends on where its 100-500 MB pool landed in memory: a second exchanger of the same type at
// the same plan ran 3-23% faster than one constructed earlier, the per-bucket average over the
// pool alone 20% faster (docs/BENCHMARKS.md, "the same plan at two speeds"); with one instance per
// variant for the whole run that placement decided the comparison. A new pool per visit draws it
// anew each time, for every variant alike. The pools hold the same non-zero values on every rank
// (an average of equal values leaves them unchanged), as a backward would write, not zero pages.
// The restored tuner stays settled on its plan; a drift window (10 iterations) does not complete
// within a visit of 4, so the rounds time the settled plan, not re-tuning.
// The noise floor: the settled tuner is visited twice per round, as two variants. The ratio of
// the two (repeat_ratio: medians; repeat_paired: median over rounds) is what two measurements of
// the very same thing differ by in this run; a gap to the best fixed plan smaller than that is not
// resolved by the run.
struct tuned_point {
  std::size_t threshold, first;
  stats it;
  int settled_at;  // -1: fixed, or a tuner that did not settle within 80 iterations
  std::size_t retunes;
  std::size_t hybrid_switch;  // Topology<Hybrid>: the switch it ran with (0: none)
  double paired_ratio = 0;    // autotuned: median over rounds of its block median / the best fixed plan's
};

// One simulated backward on every rank; the slowest rank's seconds (the same on every rank).
template <class X>
double backward_iteration(X& ex, const gflow::Layout& l, double per_elem_s) {
  MPI_Barrier(MPI_COMM_WORLD);
  double slept = 0;
  double di = simulated_backward(ex, l, per_elem_s, slept);
  MPI_Allreduce(MPI_IN_PLACE, &di, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return di;
}

// Topo: Topology<Ring> (the sweep is over thresholds) or Topology<Hybrid<1 MiB, 2>> (thresholds x
// switch at all-ring / 1 MiB / all-hierarchical; the tuner tunes the switch too).
template <class W, class Topo>
void run_autotune_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  using gflow::Overlap;
  using Pr = gflow::Precision<W>;
  using Fixed = typename gflow::Exchanger<Pr, gflow::Fusion<(4u << 20)>, Topo, Overlap<gflow::Funneled>>::template on<gflow::mpi::transport>;
  using Tuned = typename gflow::Exchanger<Pr, gflow::Fusion<gflow::Auto>, Topo, Overlap<gflow::Funneled>>::template on<gflow::mpi::transport>;
  constexpr bool hybrid = !std::is_same_v<Topo, gflow::Topology<gflow::Ring>>;
  const std::vector<std::size_t> sweep{64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 25u << 20, 64u << 20};
  const std::vector<std::size_t> switches =
      hybrid ? std::vector<std::size_t>{gflow::detail::fusion_plan::all_ring, 1u << 20, gflow::detail::fusion_plan::all_hierarchical}
             : std::vector<std::size_t>{0};
  const char* topo_name = hybrid ? "Hybrid<1MiB,2>" : "Ring";
  auto switch_name = [](std::size_t sw) -> std::string {
    if (sw == gflow::detail::fusion_plan::all_ring) return "all ring";
    if (sw == gflow::detail::fusion_plan::all_hierarchical) return "all hierarchical";
    return std::to_string(sw) + " B";
  };
  constexpr int block = 3;  // timed iterations per visit, after one warm-up
  const int rounds = std::max(2, o.iters / block);
  options cal = o;
  cal.warmup = 1;
  cal.iters = 7;
  const auto base = run_overlap_variant<gflow::Exchanger<Pr, gflow::Fusion<(4u << 20)>>>("calibration", cal, l, 0.0);
  std::mt19937 rng(20261124);  // the same order on every rank
  for (double ratio : o.compute_ratios) {
    const double per_elem = ratio * base.exchange.median / static_cast<double>(l.total_numel());
    const gflow::exchange_options eo;  // the tuner starts from 4 MiB
    gflow::mpi::transport tr(MPI_COMM_WORLD);  // one, as in a trainer: the exchangers take turns
    // non-zero gradients, the same on every rank, written once per exchanger (outside the timing)
    auto fill = [&](auto& ex) {
      float* p = ex.pool_data();
      for (std::size_t i = 0; i < ex.pool_size(); ++i) p[i] = 0.25f + static_cast<float>(i % 1021) * 0x1p-10f;
    };
    // 1. settle: identical on every rank (the tuner's phase is rank 0's, broadcast in finish())
    std::string checkpoint;
    int settled_at = -1, settled_run = 0;
    {
      Tuned tuned(tr, l, eo);
      fill(tuned);
      for (int it = 0; it < 80 && settled_run <= 10; ++it) {
        (void)backward_iteration(tuned, l, per_elem);
        if (tuned.tuner().state() == gflow::detail::fusion_tuner::phase::settled) {
          if (settled_run++ == 0) settled_at = it + 1;
        } else {
          settled_run = 0;
          settled_at = -1;
        }
      }
      std::ostringstream out;
      tuned.save_state(out);
      checkpoint = out.str();
      if (rank == 0) {
        // what it chose from: each probe's median (ms) and paired score, the model's choice, and
        // the final rounds' plans with their paired scores (the lowest settled)
        const auto& tn = tuned.tuner();
        auto plan_name = [&](const gflow::detail::fusion_plan& p) {
          return std::to_string(p.threshold) + " B" + (p.first ? " first " + std::to_string(p.first) + " B" : "") +
                 (hybrid ? " " + switch_name(p.hybrid_switch) : "");
        };
        std::string probes, finals;
        for (std::size_t i = 0; i < tn.probed_plans().size(); ++i) {
          const auto& t = tn.probe_times()[i];
          char b[48];
          std::snprintf(b, sizeof b, " %.1f ms (%.3f)", t.empty() ? 0.0 : summarize(t).median * 1e3, tn.probe_scores()[i]);
          probes += (i ? ", " : "") + plan_name(tn.probed_plans()[i]) + b;
        }
        for (std::size_t i = 0; i < tn.final_plans().size(); ++i) {
          char b[24];
          std::snprintf(b, sizeof b, " %.3f", tn.final_scores()[i]);
          finals += (i ? ", " : "") + plan_name(tn.final_plans()[i]) + b;
        }
        std::fprintf(stderr, "  ratio %.2f: tuner settled at iteration %d on %zu B (probes, median and paired score: %s; the model chose %s; final rounds: %s); %d interleaved rounds follow\n",
                     ratio, settled_at, tuned.threshold_bytes(), probes.c_str(), plan_name(tn.model_choice()).c_str(), finals.c_str(), rounds);
      }
    }
    // 2. interleaved rounds: plans[0 .. n-1] fixed, n the tuner; a fresh exchanger every visit
    struct plan_t {
      std::size_t th, sw;
    };
    std::vector<plan_t> plans;
    for (std::size_t th : sweep)
      for (std::size_t sw : switches) plans.push_back({th, sw});
    const std::size_t n = plans.size();
    std::vector<std::vector<double>> times(n + 2), block_medians(n + 2);  // n: the tuner, n + 1: the tuner again
    std::vector<std::size_t> order(n + 2);
    std::size_t tuned_threshold = 0, tuned_first = 0, tuned_switch = 0, tuned_retunes = 0;
    auto visit = [&](auto& ex, std::size_t v) {
      fill(ex);
      std::vector<double> b;
      for (int j = 0; j <= block; ++j) {
        const double di = backward_iteration(ex, l, per_elem);
        if (j > 0) b.push_back(di);
      }
      times[v].insert(times[v].end(), b.begin(), b.end());
      block_medians[v].push_back(summarize(b).median);
    };
    for (int r = 0; r < rounds; ++r) {
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::shuffle(order.begin(), order.end(), rng);
      for (std::size_t v : order) {
        if (v < n) {
          Fixed fixed(tr, l);
          fixed.set_fusion(plans[v].th);
          if constexpr (hybrid) fixed.topology().set_threshold(plans[v].sw);
          visit(fixed, v);
        } else {
          Tuned tuned(tr, l, eo);
          std::istringstream in(checkpoint);
          tuned.load_state(in);
          visit(tuned, v);  // v = n or n + 1
          std::ostringstream out;
          tuned.save_state(out);
          checkpoint = out.str();
          tuned_threshold = tuned.threshold_bytes();
          tuned_first = tuned.first_bucket_bytes();
          tuned_retunes = tuned.tuner().retunes();
          if constexpr (hybrid) tuned_switch = tuned.topology().threshold();
        }
      }
      if (rank == 0) std::fprintf(stderr, "  ratio %.2f: round %d of %d done\n", ratio, r + 1, rounds);
    }
    if (rank != 0) continue;
    std::vector<tuned_point> fixed_points;
    for (std::size_t v = 0; v < n; ++v) fixed_points.push_back({plans[v].th, 0, summarize(times[v]), -1, 0, hybrid ? plans[v].sw : 0});
    std::size_t bi = 0;
    double at25 = 1e300, at64 = 1e300;  // best over the switches at DDP's / Horovod's threshold
    for (std::size_t v = 0; v < n; ++v) {
      const auto& f = fixed_points[v];
      if (f.it.median < fixed_points[bi].it.median) bi = v;
      if (f.threshold == (25u << 20)) at25 = std::min(at25, f.it.median);
      if (f.threshold == (64u << 20)) at64 = std::min(at64, f.it.median);
    }
    const tuned_point& best = fixed_points[bi];
    tuned_point tp{tuned_threshold, tuned_first, summarize(times[n]), settled_at, tuned_retunes, tuned_switch};
    tp.paired_ratio = paired_median(block_medians[n], block_medians[bi]);
    const double repeat_ratio = summarize(times[n + 1]).median / tp.it.median, repeat_paired = paired_median(block_medians[n + 1], block_medians[n]);
    for (const auto& f : fixed_points)
      std::fprintf(stderr, "  ratio %.2f: fixed %zu B%s: %.2f ms\n", ratio, f.threshold, hybrid ? (", switch " + switch_name(f.hybrid_switch)).c_str() : "",
                   f.it.median * 1e3);
    std::fprintf(stderr, "  ratio %.2f: autotuned %zu B (first bucket %zu B%s): %.2f ms (settled at iteration %d, %zu retunes); best fixed %zu B%s: %.2f ms -> %.3f (paired %.3f); vs 25 MiB %.3f, vs 64 MiB %.3f\n",
                 ratio, tp.threshold, tp.first, hybrid ? (", switch " + switch_name(tp.hybrid_switch)).c_str() : "", tp.it.median * 1e3,
                 tp.settled_at, tp.retunes, best.threshold, hybrid ? (", switch " + switch_name(best.hybrid_switch)).c_str() : "",
                 best.it.median * 1e3, tp.it.median / best.it.median, tp.paired_ratio, tp.it.median / at25, tp.it.median / at64);
    std::fprintf(stderr, "  ratio %.2f: noise floor: the settled tuner visited again in every round: %.3f of the first (paired %.3f)\n", ratio, repeat_ratio,
                 repeat_paired);
    auto row = [&](const char* variant, const tuned_point& p) {
      std::printf(
          "{\"suite\":\"overlap\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"strategy\":\"Funneled\",\"topology\":\"%s\",\"wire\":\"%s\","
          "\"threshold_bytes\":%zu,\"first_bucket_bytes\":%zu,\"hybrid_switch_bytes\":%zu,\"iteration_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,"
          "\"compute_ratio\":%.3f,\"settled_at\":%d,\"retunes\":%zu,\"iterations\":%d,\"rounds\":%d%s}\n",
          layout_name.c_str(), P, variant, topo_name, o.wire.c_str(), p.threshold, p.first, p.hybrid_switch, p.it.median, p.it.p10, p.it.p90, ratio,
          p.settled_at, p.retunes, rounds * block, rounds,
          p.paired_ratio > 0 ? (",\"paired_ratio_vs_best\":" + std::to_string(p.paired_ratio) + ",\"repeat_ratio\":" + std::to_string(repeat_ratio) +
                                ",\"repeat_paired\":" + std::to_string(repeat_paired)).c_str()
                             : "");
    };
    for (const auto& f : fixed_points) row("fixed", f);
    row("autotuned", tp);
    std::fflush(stdout);
  }
}

template <class W>
void run_autotune_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  if (o.hybrid) run_autotune_suite<W, gflow::Topology<gflow::Hybrid<(1u << 20), 2>>>(o, l, layout_name);
  else run_autotune_suite<W, gflow::Topology<gflow::Ring>>(o, l, layout_name);
}

template <class W>
void overlap_strategies(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  using gflow::Overlap;
  using Fu = gflow::Fusion<(4u << 20)>;
  using Pr = gflow::Precision<W>;
  // calibrate: the exchange alone (no overlap), then backward time = ratio x that
  options cal = o;
  cal.warmup = 1;
  cal.iters = 7;
  const auto base = run_overlap_variant<gflow::Exchanger<Pr, Fu>>("calibration", cal, l, 0.0);
  const double per_elem = o.compute_ratio * base.exchange.median / static_cast<double>(l.total_numel());
  std::vector<overlap_result> rs;
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::None>>>("None", o, l, per_elem));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Funneled>>>("Funneled", o, l, per_elem, !o.trace.empty()));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>", o, l, per_elem));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Chained>>>("Chained", o, l, per_elem));
  if (o.learn_order) {  // the same strategies with the pool laid out in the observed backward order
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::None>>>("None+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Funneled>>>("Funneled+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Chained>>>("Chained+learn", o, l, per_elem, false, true));
  }
  if (o.shard) {  // --shard: the same strategies with Sharding<ReduceScatter> (hidden fraction of the reduce-scatter)
    using S = gflow::Sharding<gflow::ReduceScatter>;
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, S, Overlap<gflow::None>>>("None+shard", o, l, per_elem));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, S, Overlap<gflow::Funneled>>>("Funneled+shard", o, l, per_elem));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, S, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>+shard", o, l, per_elem));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, S, Overlap<gflow::Chained>>>("Chained+shard", o, l, per_elem));
  }
  if (rank != 0) return;
  std::fprintf(stderr, "%-20s %12s %12s %12s %9s\n", "strategy", "iteration_ms", "compute_ms", "exchange_ms", "hidden");
  for (auto& r : rs) {
    const double hidden = (r.compute.median + r.exchange.median - r.iteration.median) / r.exchange.median;
    std::fprintf(stderr, "%-20s %12.2f %12.2f %12.2f %8.0f%%\n", r.name.c_str(), r.iteration.median * 1e3, r.compute.median * 1e3,
                 r.exchange.median * 1e3, hidden * 100);
    std::printf(
        "{\"suite\":\"overlap\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"wire\":\"%s\",\"threshold_bytes\":%zu,"
        "\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"bytes_per_rank\":%zu,\"iteration_s\":%.9g,\"compute_s\":%.9g,"
        "\"exchange_s\":%.9g,\"hidden_fraction\":%.4f,\"compute_ratio\":%.3f,\"iterations\":%d}\n",
        layout_name.c_str(), P, r.name.c_str(), o.wire.c_str(), o.threshold, r.iteration.median, r.iteration.p10, r.iteration.p90,
        l.total_numel() * sizeof(W), r.iteration.median, r.compute.median, r.exchange.median, hidden, o.compute_ratio,
        o.iters);
  }
  std::fflush(stdout);
}

}  // namespace

int run_overlap_suite(const options& o, const gflow::Layout& l, const std::string& layout_name, int thread_level) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (thread_level < MPI_THREAD_MULTIPLE) {
    if (rank == 0) std::fprintf(stderr, "gflow_bench: the overlap suite needs MPI_THREAD_MULTIPLE (got %d)\n", thread_level);
    return 2;
  }
  if (rank == 0)
    std::fprintf(stderr, "gflow bench: suite overlap, layout %s, %d ranks, wire %s, threshold %zu B, compute = %.2f x exchange, %d+%d iterations\n",
                 layout_name.c_str(), P, o.wire.c_str(), o.threshold, o.compute_ratio, o.warmup, o.iters);
  if (o.autotune) {
    if (o.wire == "fp16") run_autotune_suite<gflow::half>(o, l, layout_name);
    else if (o.wire == "bf16") run_autotune_suite<gflow::bfloat16>(o, l, layout_name);
    else run_autotune_suite<float>(o, l, layout_name);
    return 0;
  }
  if (o.wire == "fp16") overlap_strategies<gflow::half>(o, l, layout_name);
  else if (o.wire == "bf16") overlap_strategies<gflow::bfloat16>(o, l, layout_name);
  else overlap_strategies<float>(o, l, layout_name);
  return 0;
}

}  // namespace gflow_bench
