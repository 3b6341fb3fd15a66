// gflow benchmark driver, one process per MPI rank; start it through bench/run.
//
// Suite `exchange`: on the same buffers and in one run, interleaving the variants iteration by
// iteration so that drift hits them alike:
//   mpi_per_tensor  hand-written MPI_Allreduce per tensor (generation order), then the average
//   mpi_bucketed    hand-written MPI_Allreduce per bucket, same buckets as gflow's threshold
//   mpi_whole       one MPI_Allreduce of the whole pool
//   gflow           Exchanger<Precision<wire>, Fusion> at the threshold, ready() in generation order
//   --shard:        gflow_shard         the same with Sharding<ReduceScatter> (a reduce-scatter per bucket)
//                   gflow_shard_gather  gflow_shard, then gather_shards of a pool-sized parameter buffer
//                   with --topology all (even P): gflow_shard_hierarchical2, gflow_shard_hybrid1M_2
//                   (the table's vs_gflow column: each one's median / gflow's, ring theory 0.5 and 1.0)
// Every variant averages (divides by P) and, with a 16-bit wire, divides, casts, reduces with a
// 16-bit sum operator and casts back, exactly as gflow does. Times are the slowest rank's,
// per iteration; median, p10 and p90 over the timed iterations after warm-up.
// Output: a table on stderr, one JSON object per variant on stdout (rank 0 only).
// layering: kernels/cast.hpp: the hand-written MPI baseline uses gflow's own casts and 16-bit sum
// (as a careful hand-written exchange would), so the comparison is about the exchange around them.
#include "common.hpp"

#include <gflow/detail/kernels/cast.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace gflow_bench {

namespace {

// ---- hand-written baselines ---------------------------------------------------------------------
// The hand-written loop uses gflow's casts and 16-bit sum kernel (SIMD where the CPU has it), as a
// careful hand-written exchange would: the comparison is about the exchange around them.
template <class W>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  gflow::detail::kernels::combine_wire<gflow::reduce_op::sum>(static_cast<const W*>(in), static_cast<W*>(inout), static_cast<std::size_t>(*len));
}

// The hand-written average, out of line and 64-byte aligned like gflow's kernels::scale_in_place:
// inline, the same loop took 158 or 170 us per resnet20 iteration (2 ranks) depending on where
// unrelated edits to this file put it, which moved gflow / mpi_bucketed by 7% between builds with
// gflow's own time unchanged (docs/BENCHMARKS.md, "Code placement").
[[gnu::noinline, gnu::aligned(64)]] void hand_scale(float* a, std::size_t n, float s) {
  for (std::size_t i = 0; i < n; ++i) a[i] *= s;
}

struct hand_written {
  MPI_Datatype t16 = MPI_DATATYPE_NULL;
  MPI_Op op_half = MPI_OP_NULL, op_bf16 = MPI_OP_NULL;
  hand_written() {
    MPI_Type_contiguous(2, MPI_BYTE, &t16);
    MPI_Type_commit(&t16);
    MPI_Op_create(&sum16<gflow::half>, 1, &op_half);
    MPI_Op_create(&sum16<gflow::bfloat16>, 1, &op_bf16);
  }
  ~hand_written() {
    MPI_Op_free(&op_half);
    MPI_Op_free(&op_bf16);
    MPI_Type_free(&t16);
  }
  // one allreduce of [off, off+n) with averaging, in the wire format
  void allreduce_avg(float* pool, void* wire, const std::string& fmt, std::size_t off, std::size_t n, int P) const {
    const float inv = 1.0f / static_cast<float>(P);
    if (fmt == "fp32") {
      MPI_Allreduce(MPI_IN_PLACE, pool + off, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      hand_scale(pool + off, n, inv);
    } else if (fmt == "fp16") {
      auto* w = static_cast<gflow::half*>(wire) + off;
      gflow::detail::kernels::scale_to_wire(pool + off, w, n, inv);
      MPI_Allreduce(MPI_IN_PLACE, w, static_cast<int>(n), t16, op_half, MPI_COMM_WORLD);
      (void)gflow::detail::kernels::wire_to_float(w, pool + off, n);
    } else {
      auto* w = static_cast<gflow::bfloat16*>(wire) + off;
      gflow::detail::kernels::scale_to_wire(pool + off, w, n, inv);
      MPI_Allreduce(MPI_IN_PLACE, w, static_cast<int>(n), t16, op_bf16, MPI_COMM_WORLD);
      (void)gflow::detail::kernels::wire_to_float(w, pool + off, n);
    }
  }
};

// Greedy bucketing written out by hand (whole tensors in generation order, close at >= threshold).
std::vector<std::pair<std::size_t, std::size_t>> hand_buckets(const gflow::Layout& l, std::size_t threshold, std::size_t wire_bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t off = 0, start = 0, bytes = 0;
  for (std::size_t k = l.size(); k-- > 0;) {
    off += l[k].numel;
    bytes += l[k].numel * wire_bytes;
    if (bytes >= threshold) {
      out.push_back({start, off - start});
      start = off;
      bytes = 0;
    }
  }
  if (off > start) out.push_back({start, off - start});
  return out;
}

struct variant_result {
  std::string name;
  std::size_t threshold;
  std::size_t collectives;
  stats s;
  // gflow variants: the median over iterations of this iteration's time / mpi_bucketed's time in
  // the same iteration (the two run back to back, so a drift of the machine over seconds cancels)
  double paired_ratio = 0;
};

template <class Wire>
std::vector<variant_result> run_exchange(const options& o, const gflow::Layout& l, std::size_t threshold, bool with_fixed) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  using E = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>>;
  const gflow::exchange_options eo;
  on_mpi<E> ex(tr, l, eo);
  ex.set_fusion(threshold);  // every exchanger of this run: buckets of `threshold` (--threshold)

  const std::size_t total = l.total_numel();
  std::vector<float> fresh(total);
  for (std::size_t i = 0; i < total; ++i) fresh[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 2001)) / 1000.0f - 1.0f;
  std::vector<float> pool(total);
  std::vector<std::uint16_t> wire(total);
  hand_written hw;
  const std::size_t wbytes = sizeof(Wire);
  const auto buckets = hand_buckets(l, threshold, wbytes);
  std::vector<std::pair<std::size_t, std::size_t>> per_tensor;
  {
    std::size_t off = 0;
    for (std::size_t k = l.size(); k-- > 0;) {
      per_tensor.push_back({off, l[k].numel});
      off += l[k].numel;
    }
  }
  if (ex.buckets().size() != buckets.size()) {
    std::fprintf(stderr, "gflow_bench: bucket plans differ (%zu vs %zu)\n", ex.buckets().size(), buckets.size());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }

  struct variant {
    std::string name;
    std::size_t collectives;
    std::function<void()> run;
    std::function<void()> prepare;
    std::vector<double> times;
  };
  std::vector<variant> vs;
  auto fill_pool = [&] { std::memcpy(pool.data(), fresh.data(), total * sizeof(float)); };
  auto ranges_run = [&](const std::vector<std::pair<std::size_t, std::size_t>>* rs) {
    return [&, rs] {
      for (auto [off, n] : *rs) hw.allreduce_avg(pool.data(), wire.data(), o.wire, off, n, P);
    };
  };
  static const std::vector<std::pair<std::size_t, std::size_t>> none;
  std::vector<std::pair<std::size_t, std::size_t>> whole{{0, total}};
  if (with_fixed) vs.push_back({"mpi_per_tensor", per_tensor.size(), ranges_run(&per_tensor), fill_pool, {}});
  vs.push_back({"mpi_bucketed", buckets.size(), ranges_run(&buckets), fill_pool, {}});
  if (with_fixed) vs.push_back({"mpi_whole", 1, ranges_run(&whole), fill_pool, {}});
  // Topologies over the same buckets (bench/run exchange --topology all)
  // (gflow's exchanger over another Topology)
  auto topo = []<class A>(A) -> std::optional<on_mpi<gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Topology<A>>>> {
    return std::nullopt;
  };
  auto h2 = topo(gflow::Hierarchical<2>{});
  auto h4 = topo(gflow::Hierarchical<4>{});
  auto h8 = topo(gflow::Hierarchical<8>{});
  auto h16 = topo(gflow::Hierarchical<16>{});
  auto hy = topo(gflow::Hybrid<(1u << 20), 2>{});
  auto hy8 = topo(gflow::Hybrid<(1u << 20), 8>{});
  // Another exchanger over the same pool contents, timed like gflow (every tensor ready, finish).
  auto add_exchanger = [&](auto* e, const char* name) {
    e->set_fusion(threshold);
    vs.push_back({name, e->buckets().size(),
                  [e, &l] {
                    for (std::size_t k = l.size(); k-- > 0;) e->ready(k);
                    (void)e->finish();
                  },
                  [e, &fresh, total] { std::memcpy(e->pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  };
  auto add_topology = [&](auto& opt, const char* name) {
    opt.emplace(tr, l, eo);
    add_exchanger(&*opt, name);
  };
  if (o.topologies && P >= 2) {
    add_topology(h2, "gflow_hierarchical2");
    if (P >= 4) add_topology(h4, "gflow_hierarchical4");
    if (P >= 16) add_topology(h8, "gflow_hierarchical8");    // from 16 ranks: a node of 8 GPUs (bench/platforms/gpu-nodes)
    if (P >= 32) add_topology(h16, "gflow_hierarchical16");  // Jia et al.'s best group size at 1024 GPUs
    add_topology(hy, "gflow_hybrid1M_2");
    if (P >= 16) add_topology(hy8, "gflow_hybrid1M_8");
  }
  vs.push_back({"gflow", ex.buckets().size(),
                [&] {
                  for (std::size_t k = l.size(); k-- > 0;) ex.ready(k);
                  auto st = ex.finish();
                  if (!st.finite()) std::fprintf(stderr, "gflow_bench: non-finite result\n");
                },
                [&] { std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  // --options: what each training-loop option costs (docs/DESIGN.md, "Training loops"): the same
  // exchanger with find_unused, uneven_inputs or learn_order on (every tensor ready, no rank
  // joined), so gflow_<option> / gflow is the option's own overhead.
  std::optional<on_mpi<E>> ex_unused, ex_uneven, ex_learn;
  auto add_with = [&](std::optional<on_mpi<E>>& opt, const char* name, bool gflow::exchange_options::*flag) {
    gflow::exchange_options e2 = eo;
    e2.*flag = true;
    opt.emplace(tr, l, e2);
    add_exchanger(&*opt, name);
  };
  if (o.loop_options) {
    add_with(ex_unused, "gflow_find_unused", &gflow::exchange_options::find_unused);
    add_with(ex_uneven, "gflow_uneven_inputs", &gflow::exchange_options::uneven_inputs);
    add_with(ex_learn, "gflow_learn_order", &gflow::exchange_options::learn_order);
  }
  // --trace FILE: the same exchanger with a timeline attached (gflow_traced / gflow is what the
  // timeline costs when on); its events of every iteration and rank go to FILE.
  std::optional<on_mpi<E>> ext;
  std::optional<gflow::timeline> tl;
  if (!o.trace.empty()) {
    ext.emplace(tr, l, eo);
    tl.emplace();
    ext->set_timeline(&*tl);
    tl->start(tr);
    add_exchanger(&*ext, "gflow_traced");
  }
  // The same exchanger on a transport without timeouts (plain blocking MPI calls on this
  // thread): what the default, timed transport costs is gflow / gflow_untimed.
  gflow::mpi::transport untimed(MPI_COMM_WORLD, std::chrono::milliseconds(0));
  on_mpi<E> ex0(untimed, l, eo);
  add_exchanger(&ex0, "gflow_untimed");
  // --shard: Sharding<ReduceScatter> over the same buckets: the exchange alone, and the exchange
  // followed by the all-gather of a parameter buffer laid out like the pool (a ZeRO-2 step's traffic).
  using ES = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Sharding<gflow::ReduceScatter>>;
  std::optional<on_mpi<ES>> exs, exsg;
  std::vector<float> params(total);
  if (o.shard) {
    exs.emplace(tr, l, eo);
    add_exchanger(&*exs, "gflow_shard");
    exsg.emplace(tr, l, eo);
    exsg->set_fusion(threshold);
    vs.push_back({"gflow_shard_gather", 2 * exsg->buckets().size(),
                  [&] {
                    for (std::size_t k = l.size(); k-- > 0;) exsg->ready(k);
                    (void)exsg->finish();
                    exsg->gather_shards(params);
                  },
                  [&] {
                    std::memcpy(exsg->pool_data(), fresh.data(), total * sizeof(float));
                    std::memcpy(params.data(), fresh.data(), total * sizeof(float));
                  },
                  {}});
  }
  // --shard --topology all: the sharded exchange over Hierarchical<2> and Hybrid<1 MiB, 2> too, each
  // against its own allreduce above (gflow_hierarchical2, gflow_hybrid1M_2).
  auto stopo = []<class A>(A) -> std::optional<on_mpi<gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Topology<A>,
                                                                          gflow::Sharding<gflow::ReduceScatter>>>> { return std::nullopt; };
  auto sh2 = stopo(gflow::Hierarchical<2>{});
  auto shy = stopo(gflow::Hybrid<(1u << 20), 2>{});
  if (o.shard && o.topologies && P >= 2 && P % 2 == 0) {
    add_topology(sh2, "gflow_shard_hierarchical2");
    add_topology(shy, "gflow_shard_hybrid1M_2");
  }
  // With a 16-bit wire, the fp32 exchange of the same pool in the same run (bench/run exchange
  // --wire fp16 reports gflow / gflow_fp32).
  using E32 = gflow::Exchanger<gflow::Precision<float>, gflow::Fusion<(4u << 20)>>;
  std::optional<on_mpi<E32>> ex32;
  if constexpr (!std::is_same_v<Wire, float>) {
    ex32.emplace(tr, l, eo);
    add_exchanger(&*ex32, "gflow_fp32");
  }

  // Variants interleaved iteration by iteration, in a new random order every iteration (the same
  // seed on every rank), so that no variant always runs after the same one: what the previous
  // variant leaves in the caches and in MPI's shared-memory state is spread over all of them. (A
  // rotation of one fixed order, used before 2026-11-24, still put each variant after the same
  // one in all but one position of the cycle.)
  std::vector<std::size_t> order(vs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffle_rng(20261124u);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    if (o.rotated) std::iota(order.begin(), order.end(), static_cast<std::size_t>(it));  // then taken mod vs.size()
    else std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (std::size_t j = 0; j < vs.size(); ++j) {
      auto& v = vs[order[j] % vs.size()];
      v.prepare();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      v.run();
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= o.warmup) v.times.push_back(dt);
    }
    if (rank == 0 && isatty(2)) std::fprintf(stderr, "\r  threshold %zu B: iteration %d/%d", threshold, it + 1, o.warmup + o.iters);
  }
  if (rank == 0) {
    if (isatty(2)) std::fprintf(stderr, "\r%60s\r", "");
    else std::fprintf(stderr, "  threshold %zu B: %d iterations done\n", threshold, o.warmup + o.iters);
  }
  if (tl) {
    ext->set_timeline(nullptr);
    tl->write_chrome_trace(tr, o.trace);
    if (rank == 0) std::fprintf(stderr, "  trace: %zu events per rank (rank 0), %zu dropped, written to %s\n", tl->size(), tl->dropped(), o.trace.c_str());
  }
  // gflow and the hand-written bucketed run must agree bit for bit
  {
    fill_pool();
    ranges_run(&buckets)();
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    for (std::size_t k = l.size(); k-- > 0;) ex.ready(k);
    (void)ex.finish();
    if (std::memcmp(pool.data(), ex.pool_data(), total * sizeof(float)) != 0 && rank == 0)
      std::fprintf(stderr, "gflow_bench: WARNING gflow and hand-written bucketed results differ\n");
  }
  std::vector<variant_result> out;
  const variant* hand = nullptr;
  for (auto& v : vs)
    if (v.name == "mpi_bucketed") hand = &v;
  for (auto& v : vs) {
    out.push_back({v.name, v.name == "mpi_per_tensor" || v.name == "mpi_whole" ? 0 : threshold, v.collectives, summarize(v.times)});
    if (hand != nullptr && v.name.rfind("gflow", 0) == 0) {
      out.back().paired_ratio = paired_median(v.times, hand->times);
    }
  }
  return out;
}

std::vector<variant_result> run_wire(const options& o, const gflow::Layout& l, std::size_t threshold, bool with_fixed) {
  if (o.wire == "fp16") return run_exchange<gflow::half>(o, l, threshold, with_fixed);
  if (o.wire == "bf16") return run_exchange<gflow::bfloat16>(o, l, threshold, with_fixed);
  return run_exchange<float>(o, l, threshold, with_fixed);
}

}  // namespace

int run_exchange_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const std::size_t wbytes = o.wire == "fp32" ? 4 : 2;
  const std::size_t payload = l.total_numel() * wbytes;
  std::vector<std::size_t> thresholds{o.threshold};
  if (o.sweep) {
    thresholds.clear();
    for (std::size_t t = 64u << 10; t <= (256u << 20); t *= 2) thresholds.push_back(t);
  }
  if (rank == 0)
    std::fprintf(stderr, "gflow bench: suite exchange, layout %s (%zu tensors, %.1f M elements), %d ranks, wire %s, %d+%d iterations\n",
                 layout_name.c_str(), l.size(), static_cast<double>(l.total_numel()) / 1e6, P, o.wire.c_str(), o.warmup, o.iters);
  std::vector<variant_result> all;
  for (std::size_t k = 0; k < thresholds.size(); ++k) {
    auto rs = run_wire(o, l, thresholds[k], k == 0);
    all.insert(all.end(), rs.begin(), rs.end());
  }
  if (rank == 0) {
    std::fprintf(stderr, "%-26s %14s %6s %12s %12s %12s %10s %8s %9s\n", "variant", "threshold_B", "colls", "median_ms", "p10_ms", "p90_ms", "vs_bucket",
                 "paired", o.shard ? "vs_allred" : o.wire == "fp32" ? "" : "vs_fp32");
    std::map<std::size_t, double> bucketed, fp32;
    std::map<std::pair<std::string, std::size_t>, double> plain;  // every gflow variant: a sharded one's allreduce
    // A sharded variant's allreduce: gflow_shard_hierarchical2 -> gflow_hierarchical2; gflow_shard(_gather) -> gflow.
    auto base_of = [](const std::string& n) -> std::string {
      const std::string rest = n.size() > 12 ? n.substr(12) : "";
      return n.rfind("gflow_shard_", 0) == 0 && rest != "gather" ? "gflow_" + rest : "gflow";
    };
    for (auto& r : all) {
      if (r.name.rfind("gflow", 0) == 0) plain[{r.name, r.threshold}] = r.s.median;
      if (r.name == "mpi_bucketed") bucketed[r.threshold] = r.s.median;
      if (r.name == "gflow_fp32") fp32[r.threshold] = r.s.median;
    }
    auto fmt = [](double v) { return v > 0 ? std::to_string(v).substr(0, 5) : std::string(); };
    for (auto& r : all) {
      const bool ours = r.name.rfind("gflow", 0) == 0;
      const double ratio = (ours && bucketed.count(r.threshold)) ? r.s.median / bucketed[r.threshold] : 0.0;
      const double vs32 = (r.name == "gflow" && fp32.count(r.threshold)) ? r.s.median / fp32[r.threshold] : 0.0;
      const std::string base = base_of(r.name);
      const double vsg = (r.name.rfind("gflow_shard", 0) == 0 && plain.count({base, r.threshold})) ? r.s.median / plain[{base, r.threshold}] : 0.0;
      std::fprintf(stderr, "%-26s %14zu %6zu %12.3f %12.3f %12.3f %10s %8s %9s\n", r.name.c_str(), r.threshold, r.collectives, r.s.median * 1e3,
                   r.s.p10 * 1e3, r.s.p90 * 1e3, fmt(ratio).c_str(), fmt(r.paired_ratio).c_str(), fmt(o.shard ? vsg : vs32).c_str());
      std::printf(
          "{\"suite\":\"exchange\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"wire\":\"%s\",\"threshold_bytes\":%zu,"
          "\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"bytes_per_rank\":%zu,\"collectives\":%zu,\"iterations\":%d%s%s%s%s}\n",
          layout_name.c_str(), P, r.name.c_str(), o.wire.c_str(), r.threshold, r.s.median, r.s.p10, r.s.p90,
          r.name == "gflow_fp32" ? l.total_numel() * 4 : payload, r.collectives, o.iters,
          ratio > 0 ? (",\"ratio_vs_mpi_bucketed\":" + std::to_string(ratio)).c_str() : "",
          r.paired_ratio > 0 ? (",\"paired_ratio_vs_mpi_bucketed\":" + std::to_string(r.paired_ratio)).c_str() : "",
          vs32 > 0 ? (",\"ratio_vs_gflow_fp32\":" + std::to_string(vs32)).c_str() : "",
          vsg > 0 ? (",\"ratio_vs_" + base + "\":" + std::to_string(vsg)).c_str() : "");
    }
    if (o.sweep) {
      const variant_result* best = nullptr;
      for (auto& r : all)
        if (r.name == "gflow" && (!best || r.s.median < best->s.median)) best = &r;
      if (best) std::fprintf(stderr, "best gflow threshold for %s on %d ranks: %zu B (%.3f ms)\n", layout_name.c_str(), P, best->threshold, best->s.median * 1e3);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace gflow_bench
