// gflow benchmark driver, one process per MPI rank; start it through bench/run.
//
// Suite `exchange`: on the same buffers and in one run, interleaving the variants iteration by
// iteration so that drift hits them alike:
//   mpi_per_tensor  hand-written MPI_Allreduce per tensor (generation order), then the average
//   mpi_bucketed    hand-written MPI_Allreduce per bucket, same buckets as gflow's threshold
//   mpi_whole       one MPI_Allreduce of the whole pool
//   gflow           Exchanger<Precision<wire>, Fusion> at the threshold, ready() in generation order
// Every variant averages (divides by P) and, with a 16-bit wire, divides, casts, reduces with a
// 16-bit sum operator and casts back, exactly as gflow does. Times are the slowest rank's,
// per iteration; median, p10 and p90 over the timed iterations after warm-up.
// Output: a table on stderr, one JSON object per variant on stdout (rank 0 only).
#include <mpi.h>
#include <unistd.h>

#include <gflow/exchanger.hpp>
#include <gflow/kernels/topk.hpp>
#include <gflow/plan/density.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mpi.hpp>

#include "suites.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <chrono>
#include <vector>

namespace {

struct options {
  std::string suite = "exchange";
  std::string layout = "resnet50";
  bool layout_given = false;
  std::string wire = "fp32";
  std::size_t threshold = 4u << 20;
  bool quick = false;
  bool sweep = false;
  double compute_ratio = 1.5;  // overlap: simulated backward time / measured exchange time
  std::vector<double> densities{0.001, 0.01};  // sparse
  std::string transport = "mpi";               // sparse: mpi or inproc
  bool topologies = false;                     // exchange: also Hierarchical<2|4> and Hybrid
  int ranks = 0;                               // inproc: thread ranks
  int iters = 0, warmup = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gflow_bench: %s\n"
               "usage: bench/run exchange|overlap [--ranks N] [--layout NAME|PATH] [--threshold BYTES] [--wire fp32|fp16|bf16]\n"
               "                          [--quick] [--sweep] [--iters N] [--warmup N] [--compute-ratio R]\n"
               "       bench/run sparse [--ranks N] [--layout L] [--density 0.001,0.01] [--transport mpi|inproc]\n"
               "       bench/run kernels [--layout L1,L2 (default resnet50,gpt2_small)] [--iters N] [--warmup N]\n",
               why.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

std::size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string suf(end ? end : "");
  double mul = 1;
  if (suf == "K" || suf == "KiB" || suf == "k") mul = 1024;
  else if (suf == "M" || suf == "MiB") mul = 1024.0 * 1024;
  else if (suf == "G" || suf == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (!suf.empty()) usage("cannot read byte count '" + s + "' (use e.g. 4194304, 4M or 64K)");
  if (!(v > 0)) usage("--threshold must be positive, got '" + s + "'");
  return static_cast<std::size_t>(v * mul);
}

options parse(int argc, char** argv) {
  options o;
  int i = 1;
  if (i < argc && argv[i][0] != '-') o.suite = argv[i++];
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--layout") {
      o.layout = next();
      o.layout_given = true;
    }
    else if (a == "--wire") o.wire = next();
    else if (a == "--threshold") o.threshold = parse_bytes(next());
    else if (a == "--quick") o.quick = true;
    else if (a == "--sweep") o.sweep = true;
    else if (a == "--compute-ratio") o.compute_ratio = std::stod(next());
    else if (a == "--density") {
      o.densities.clear();
      std::string v = next();
      for (std::size_t p0 = 0; p0 <= v.size();) {
        const std::size_t c = v.find(',', p0);
        o.densities.push_back(std::stod(v.substr(p0, c == std::string::npos ? std::string::npos : c - p0)));
        if (c == std::string::npos) break;
        p0 = c + 1;
      }
    } else if (a == "--transport") o.transport = next();
    else if (a == "--topology") {
      const std::string v = next();
      if (v == "all") o.topologies = true;
      else if (v != "ring") usage("--topology takes ring or all (ring + Hierarchical<2>, <4> + Hybrid<1 MiB, 2>)");
    }
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--ranks") o.ranks = std::stoi(next());  // MPI ranks are bench/run's business
    else usage("unknown option '" + a + "'");
  }
  if (o.suite != "exchange" && o.suite != "overlap" && o.suite != "sparse" && o.suite != "kernels")
    usage("unknown suite '" + o.suite + "' (available: exchange, overlap, sparse, kernels)");
  if (o.suite == "kernels" && !o.layout_given) o.layout = "resnet50,gpt2_small";
  if (o.transport != "mpi" && o.transport != "inproc") usage("--transport must be mpi or inproc");
  for (double d : o.densities)
    if (!(d > 0 && d <= 1)) usage("--density values must be in (0, 1]");
  if (!(o.compute_ratio >= 0)) usage("--compute-ratio must be >= 0");
  if (o.wire != "fp32" && o.wire != "fp16" && o.wire != "bf16") usage("--wire must be fp32, fp16 or bf16");
  if (o.iters == 0) o.iters = o.quick ? 7 : 15;
  if (o.warmup == 0) o.warmup = o.quick ? 1 : 3;
  if (o.iters < 7) usage("--iters must be at least 7 (medians of fewer are not reported)");
  return o;
}

gflow::Layout load_layout(const std::string& name) {
  if (name.find('/') != std::string::npos || name.find(".tsv") != std::string::npos) return gflow::Layout::from_tsv(name);
  return gflow::Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/" + name + ".tsv");
}

// ---- hand-written baselines ---------------------------------------------------------------------
// The hand-written loop uses gflow's casts and 16-bit sum kernel (SIMD where the CPU has it), as a
// careful hand-written exchange would: the comparison is about the exchange around them.
template <class W>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  gflow::kernels::combine_wire<gflow::reduce_op::sum>(static_cast<const W*>(in), static_cast<W*>(inout), static_cast<std::size_t>(*len));
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
      for (std::size_t i = 0; i < n; ++i) pool[off + i] *= inv;
    } else if (fmt == "fp16") {
      auto* w = static_cast<gflow::half*>(wire) + off;
      gflow::kernels::scale_to_wire(pool + off, w, n, inv);
      MPI_Allreduce(MPI_IN_PLACE, w, static_cast<int>(n), t16, op_half, MPI_COMM_WORLD);
      (void)gflow::kernels::wire_to_float(w, pool + off, n);
    } else {
      auto* w = static_cast<gflow::bfloat16*>(wire) + off;
      gflow::kernels::scale_to_wire(pool + off, w, n, inv);
      MPI_Allreduce(MPI_IN_PLACE, w, static_cast<int>(n), t16, op_bf16, MPI_COMM_WORLD);
      (void)gflow::kernels::wire_to_float(w, pool + off, n);
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

struct stats {
  double median, p10, p90;
};
stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double f) {
    const double idx = f * static_cast<double>(v.size() - 1);
    const auto lo = static_cast<std::size_t>(std::floor(idx));
    const auto hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  return {q(0.5), q(0.1), q(0.9)};
}

template <class E>
using on_mpi = typename E::template on<gflow::mpi::transport>;

struct variant_result {
  std::string name;
  std::size_t threshold;
  std::size_t collectives;
  stats s;
};

template <class Wire>
std::vector<variant_result> run_exchange(const options& o, const gflow::Layout& l, std::size_t threshold, bool with_fixed) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  using E = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>>;
  gflow::exchange_options eo;
  eo.threshold_bytes = threshold;
  on_mpi<E> ex(tr, l, eo);

  const std::size_t total = l.total_numel();
  std::vector<float> fresh(total);
  for (std::size_t i = 0; i < total; ++i) fresh[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 2001)) / 1000.0f - 1.0f;
  std::vector<float> pool(total);
  std::vector<std::uint16_t> wire(total);
  hand_written hw;
  const std::size_t wbytes = sizeof(typename Wire::type);
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
  using H2 = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Topology<gflow::Hierarchical<2>>>;
  using H4 = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Topology<gflow::Hierarchical<4>>>;
  using Hy = gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(4u << 20)>, gflow::Topology<gflow::Hybrid<(1u << 20), 2>>>;
  std::optional<on_mpi<H2>> h2;
  std::optional<on_mpi<H4>> h4;
  std::optional<on_mpi<Hy>> hy;
  auto add_topology = [&](auto& opt, const char* name) {
    opt.emplace(tr, l, eo);
    auto* e = &*opt;
    vs.push_back({name, e->buckets().size(),
                  [e, &l] {
                    for (std::size_t k = l.size(); k-- > 0;) e->ready(k);
                    (void)e->finish();
                  },
                  [e, &fresh, total] { std::memcpy(e->pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  };
  if (o.topologies && P >= 2) {
    add_topology(h2, "gflow_hierarchical2");
    if (P >= 4) add_topology(h4, "gflow_hierarchical4");
    add_topology(hy, "gflow_hybrid1M_2");
  }
  vs.push_back({"gflow", ex.buckets().size(),
                [&] {
                  for (std::size_t k = l.size(); k-- > 0;) ex.ready(k);
                  auto st = ex.finish();
                  if (!st.finite()) std::fprintf(stderr, "gflow_bench: non-finite result\n");
                },
                [&] { std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  // The same exchanger on a transport without timeouts (plain blocking MPI calls on this
  // thread): what the default, timed transport costs is gflow / gflow_untimed.
  gflow::mpi::transport untimed(MPI_COMM_WORLD, std::chrono::milliseconds(0));
  on_mpi<E> ex0(untimed, l, eo);
  vs.push_back({"gflow_untimed", ex0.buckets().size(),
                [&] {
                  for (std::size_t k = l.size(); k-- > 0;) ex0.ready(k);
                  (void)ex0.finish();
                },
                [&] { std::memcpy(ex0.pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  // With a 16-bit wire, the fp32 exchange of the same pool in the same run (bench/run exchange
  // --wire fp16 reports gflow / gflow_fp32).
  using E32 = gflow::Exchanger<gflow::Precision<gflow::wire::fp32>, gflow::Fusion<(4u << 20)>>;
  std::optional<on_mpi<E32>> ex32;
  if constexpr (!std::is_same_v<Wire, gflow::wire::fp32>) {
    ex32.emplace(tr, l, eo);
    auto* e = &*ex32;
    vs.push_back({"gflow_fp32", e->buckets().size(),
                  [e, &l] {
                    for (std::size_t k = l.size(); k-- > 0;) e->ready(k);
                    (void)e->finish();
                  },
                  [e, &fresh, total] { std::memcpy(e->pool_data(), fresh.data(), total * sizeof(float)); }, {}});
  }

  // Variants interleaved iteration by iteration, and the order rotated every iteration, so that no
  // variant always runs after the same one (what the previous variant leaves in the caches and in
  // MPI's shared-memory state is spread over all of them).
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    for (std::size_t j = 0; j < vs.size(); ++j) {
      auto& v = vs[(j + static_cast<std::size_t>(it)) % vs.size()];
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
  for (auto& v : vs) out.push_back({v.name, v.name == "mpi_per_tensor" || v.name == "mpi_whole" ? 0 : threshold, v.collectives, summarize(v.times)});
  return out;
}

std::vector<variant_result> run_wire(const options& o, const gflow::Layout& l, std::size_t threshold, bool with_fixed) {
  if (o.wire == "fp16") return run_exchange<gflow::wire::fp16>(o, l, threshold, with_fixed);
  if (o.wire == "bf16") return run_exchange<gflow::wire::bf16>(o, l, threshold, with_fixed);
  return run_exchange<gflow::wire::fp32>(o, l, threshold, with_fixed);
}

// ---- suite overlap -------------------------------------------------------------------------------
// A simulated backward: tensor k's gradient takes time proportional to its size, spent sleeping
// (the model of a backward pass running on an accelerator while the host communicates; spinning
// would fight the communication for this machine's 2 cores), then ready(k). Short waits are
// batched (a sleep is only taken once 200 us are owed) so the per-call overhead of sleeping does
// not inflate the small tensors.
struct overlap_result {
  std::string name;
  stats iteration, exchange, compute;
};

template <class E>
overlap_result run_overlap_variant(const char* name, const options& o, const gflow::Layout& l, double per_elem_s) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  gflow::exchange_options eo;
  eo.threshold_bytes = o.threshold;
  typename E::template on<gflow::mpi::transport> ex(tr, l, eo);
  const std::size_t total = l.total_numel();
  std::vector<float> fresh(total, 0.5f);
  std::vector<double> it_t, ex_t, co_t;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    // exchange alone: every gradient ready at once
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (std::size_t k = l.size(); k-- > 0;) ex.ready(k);
    (void)ex.finish();
    double dx = MPI_Wtime() - t0;
    // backward with the exchange overlapped
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    double owed = 0, slept = 0;
    for (std::size_t k = l.size(); k-- > 0;) {
      owed += per_elem_s * static_cast<double>(l[k].numel);
      if (owed >= 200e-6 || k == 0) {
        const double s0 = MPI_Wtime();
        std::this_thread::sleep_for(std::chrono::duration<double>(owed));
        const double took = MPI_Wtime() - s0;
        slept += took;
        owed -= took;
      }
      ex.ready(k);
    }
    (void)ex.finish();
    double di = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &di, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &slept, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it >= o.warmup) {
      ex_t.push_back(dx);
      it_t.push_back(di);
      co_t.push_back(slept);
    }
  }
  return {name, summarize(it_t), summarize(ex_t), summarize(co_t)};
}

template <class W>
void run_overlap_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
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
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Funneled>>>("Funneled", o, l, per_elem));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>", o, l, per_elem));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Chained>>>("Chained", o, l, per_elem));
  if (rank != 0) return;
  std::fprintf(stderr, "%-14s %12s %12s %12s %9s\n", "strategy", "iteration_ms", "compute_ms", "exchange_ms", "hidden");
  for (auto& r : rs) {
    const double hidden = (r.compute.median + r.exchange.median - r.iteration.median) / r.exchange.median;
    std::fprintf(stderr, "%-14s %12.2f %12.2f %12.2f %8.0f%%\n", r.name.c_str(), r.iteration.median * 1e3, r.compute.median * 1e3,
                 r.exchange.median * 1e3, hidden * 100);
    std::printf(
        "{\"suite\":\"overlap\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"wire\":\"%s\",\"threshold_bytes\":%zu,"
        "\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"bytes_per_rank\":%zu,\"iteration_s\":%.9g,\"compute_s\":%.9g,"
        "\"exchange_s\":%.9g,\"hidden_fraction\":%.4f,\"compute_ratio\":%.3f,\"iterations\":%d}\n",
        layout_name.c_str(), P, r.name.c_str(), o.wire.c_str(), o.threshold, r.iteration.median, r.iteration.p10, r.iteration.p90,
        l.total_numel() * sizeof(typename W::type), r.iteration.median, r.compute.median, r.exchange.median, hidden, o.compute_ratio,
        o.iters);
  }
  std::fflush(stdout);
}

// ---- suite sparse ---------------------------------------------------------------------------------
// Dense (Fusion at --threshold) against TopK and GTopK (selection over the whole pool: no Fusion)
// on the same gradients. select_s is the exact top-k selection alone (kernels::select_topk_sampled over
// the pool, what the engines run), timed on the same data in the same run; comm_s = the
// iteration minus select_s (derived, reported as such).
struct sparse_result {
  std::string name;
  double density;
  stats total, select;
  std::size_t wire_bytes;
};

template <class E, class T, class Setup>
sparse_result measure_sparse(T& t, const options& o, const gflow::Layout& l, const char* name, double density, bool selects, Setup setup) {
  typename E::template on<T> ex(t, l);
  setup(ex);
  const std::size_t total = l.total_numel();
  std::vector<float> fresh(total);
  for (std::size_t i = 0; i < total; ++i)
    fresh[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(t.rank()) * 40503u) % 20011)) / 10000.0f - 1.0f;
  const std::size_t k = gflow::plan::k_for(density, total);
  gflow::kernels::topk_workspace ws;
  if (selects) ws.reserve(total, k);
  std::vector<std::uint64_t> picked(selects ? k : 0);
  std::vector<double> tt, st;
  std::size_t bytes = 0;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    t.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t q = l.size(); q-- > 0;) ex.ready(q);
    auto status = ex.finish();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes = status.wire_bytes;
    double ds = 0;
    if (selects) {
      t.barrier();
      auto s0 = std::chrono::steady_clock::now();
      (void)gflow::kernels::select_topk_sampled(fresh.data(), total, k, 0, picked.data(), ws);  // the engines' selection
      ds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    }
    t.all_reduce(&dt, 1, gflow::reduce_op::max);
    t.all_reduce(&ds, 1, gflow::reduce_op::max);
    if (it >= o.warmup) {
      tt.push_back(dt);
      st.push_back(ds);
    }
  }
  return {name, density, summarize(tt), summarize(st), bytes};
}

template <class T>
std::vector<sparse_result> run_sparse_on(T& t, const options& o, const gflow::Layout& l) {
  using gflow::Exchanger;
  using gflow::Sparsifier;
  std::vector<sparse_result> rs;
  auto none = [](auto&) {};
  rs.push_back(measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>>>(t, o, l, "dense", 1.0, false, [&](auto& ex) { ex.set_fusion(o.threshold); }));
  for (double d : o.densities) {
    auto dens = [d](auto& ex) { ex.sparsifier().set_density(d); };
    rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::TopK<0.01>>>>(t, o, l, "TopK", d, true, dens));
    rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::GTopK<0.01>>>>(t, o, l, "GTopK", d, true, dens));
    // CSC exchanges a whole percent of its 32K-element chunks: run it where d * 100 is whole.
    const double pct = d * 100.0;
    if (pct >= 1.0 && pct == std::floor(pct)) {
      rs.push_back(measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, Sparsifier<gflow::CSC<32768, 15>>>>(
          t, o, l, "CSC", d, false, [&](auto& ex) {
            ex.set_fusion(o.threshold);
            ex.sparsifier().set_percent(static_cast<unsigned>(pct));
            ex.sparsifier().set_warmup(0, 0);  // iteration 0 is dense regardless: the warm-up iteration covers it
          }));
    }
  }
  (void)none;
  return rs;
}

void report_sparse(const options& o, const std::vector<sparse_result>& rs, const std::string& layout_name, const gflow::Layout& l, int P) {
  std::fprintf(stderr, "%-8s %9s %12s %12s %12s %12s %14s %8s\n", "variant", "density", "median_ms", "p10_ms", "p90_ms", "select_ms", "comm_ms", "vs_dense");
  const double dense = rs.front().total.median;
  for (const auto& r : rs) {
    const double comm = r.total.median - r.select.median;
    std::fprintf(stderr, "%-8s %9.4f %12.2f %12.2f %12.2f %12.2f %14.2f %8.3f\n", r.name.c_str(), r.density, r.total.median * 1e3, r.total.p10 * 1e3,
                 r.total.p90 * 1e3, r.select.median * 1e3, comm * 1e3, r.total.median / dense);
    std::printf(
        "{\"suite\":\"sparse\",\"layout\":\"%s\",\"ranks\":%d,\"transport\":\"%s\",\"variant\":\"%s\",\"wire\":\"%s\","
        "\"threshold_bytes\":%zu,\"density\":%.6g,\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"select_s\":%.9g,"
        "\"comm_s\":%.9g,\"comm_s_derived\":true,\"bytes_per_rank\":%zu,\"pool_elements\":%zu,\"iterations\":%d}\n",
        layout_name.c_str(), P, o.transport.c_str(), r.name.c_str(), o.wire.c_str(), r.name == "dense" ? o.threshold : std::size_t{0}, r.density,
        r.total.median, r.total.p10, r.total.p90, r.select.median, comm, r.wire_bytes, l.total_numel(), o.iters);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // overlap suite: issuing threads
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const options o = parse(argc, argv);
  if (o.suite == "kernels") {
    int rc = 0;
    if (rank == 0) {
      gflow_bench::kernels_options ko;
      ko.iters = o.iters;
      ko.warmup = o.warmup;
      try {
        for (std::size_t p0 = 0; p0 <= o.layout.size();) {
          const std::size_t c = o.layout.find(',', p0);
          std::string name = o.layout.substr(p0, c == std::string::npos ? std::string::npos : c - p0);
          ko.sizes.push_back({name, load_layout(name).total_numel()});
          if (c == std::string::npos) break;
          p0 = c + 1;
        }
        rc = gflow_bench::run_kernels_suite(ko);
      } catch (const gflow::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        rc = 2;
      }
    }
    MPI_Finalize();
    return rc;
  }
  gflow::Layout l;
  try {
    l = load_layout(o.layout);
  } catch (const gflow::error& e) {
    if (rank == 0) std::fprintf(stderr, "%s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  std::string layout_name = o.layout;
  if (auto s = layout_name.find_last_of('/'); s != std::string::npos) layout_name = layout_name.substr(s + 1);
  if (auto d = layout_name.find(".tsv"); d != std::string::npos) layout_name = layout_name.substr(0, d);
  const std::size_t wbytes = o.wire == "fp32" ? 4 : 2;
  const std::size_t payload = l.total_numel() * wbytes;

  if (o.suite == "sparse") {
    if (o.transport == "inproc") {
      const int R = o.ranks > 0 ? o.ranks : 4;
      if (P != 1) {
        if (rank == 0) std::fprintf(stderr, "gflow_bench: --transport inproc runs its ranks as threads of one process (bench/run starts one)\n");
        MPI_Finalize();
        return 2;
      }
      std::fprintf(stderr, "gflow bench: suite sparse, layout %s, %d in-process ranks, %d+%d iterations\n", layout_name.c_str(), R, o.warmup, o.iters);
      std::vector<sparse_result> rs;
      gflow::inproc::run(R, [&](gflow::inproc::transport& t) {
        auto mine = run_sparse_on(t, o, l);
        if (t.rank() == 0) rs = std::move(mine);
      }, std::chrono::minutes(10));
      report_sparse(o, rs, layout_name, l, R);
    } else {
      if (rank == 0)
        std::fprintf(stderr, "gflow bench: suite sparse, layout %s, %d MPI ranks, %d+%d iterations\n", layout_name.c_str(), P, o.warmup, o.iters);
      gflow::mpi::transport t(MPI_COMM_WORLD);
      auto rs = run_sparse_on(t, o, l);
      if (rank == 0) report_sparse(o, rs, layout_name, l, P);
    }
    MPI_Finalize();
    return 0;
  }
  if (o.suite == "overlap") {
    if (provided < MPI_THREAD_MULTIPLE) {
      if (rank == 0) std::fprintf(stderr, "gflow_bench: the overlap suite needs MPI_THREAD_MULTIPLE (got %d)\n", provided);
      MPI_Finalize();
      return 2;
    }
    if (rank == 0)
      std::fprintf(stderr, "gflow bench: suite overlap, layout %s, %d ranks, wire %s, threshold %zu B, compute = %.2f x exchange, %d+%d iterations\n",
                   layout_name.c_str(), P, o.wire.c_str(), o.threshold, o.compute_ratio, o.warmup, o.iters);
    if (o.wire == "fp16") run_overlap_suite<gflow::wire::fp16>(o, l, layout_name);
    else if (o.wire == "bf16") run_overlap_suite<gflow::wire::bf16>(o, l, layout_name);
    else run_overlap_suite<gflow::wire::fp32>(o, l, layout_name);
    MPI_Finalize();
    return 0;
  }
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
    std::fprintf(stderr, "%-20s %14s %6s %12s %12s %12s %10s %8s\n", "variant", "threshold_B", "colls", "median_ms", "p10_ms", "p90_ms", "vs_bucket",
                 o.wire == "fp32" ? "" : "vs_fp32");
    std::map<std::size_t, double> bucketed, fp32;
    for (auto& r : all) {
      if (r.name == "mpi_bucketed") bucketed[r.threshold] = r.s.median;
      if (r.name == "gflow_fp32") fp32[r.threshold] = r.s.median;
    }
    auto fmt = [](double v) { return v > 0 ? std::to_string(v).substr(0, 5) : std::string(); };
    for (auto& r : all) {
      const bool ours = r.name.rfind("gflow", 0) == 0;
      const double ratio = (ours && bucketed.count(r.threshold)) ? r.s.median / bucketed[r.threshold] : 0.0;
      const double vs32 = (r.name == "gflow" && fp32.count(r.threshold)) ? r.s.median / fp32[r.threshold] : 0.0;
      std::fprintf(stderr, "%-20s %14zu %6zu %12.3f %12.3f %12.3f %10s %8s\n", r.name.c_str(), r.threshold, r.collectives, r.s.median * 1e3,
                   r.s.p10 * 1e3, r.s.p90 * 1e3, fmt(ratio).c_str(), fmt(vs32).c_str());
      std::printf(
          "{\"suite\":\"exchange\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"wire\":\"%s\",\"threshold_bytes\":%zu,"
          "\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"bytes_per_rank\":%zu,\"collectives\":%zu,\"iterations\":%d%s%s}\n",
          layout_name.c_str(), P, r.name.c_str(), o.wire.c_str(), r.threshold, r.s.median, r.s.p10, r.s.p90,
          r.name == "gflow_fp32" ? l.total_numel() * 4 : payload, r.collectives, o.iters,
          ratio > 0 ? (",\"ratio_vs_mpi_bucketed\":" + std::to_string(ratio)).c_str() : "",
          vs32 > 0 ? (",\"ratio_vs_gflow_fp32\":" + std::to_string(vs32)).c_str() : "");
    }
    if (o.sweep) {
      const variant_result* best = nullptr;
      for (auto& r : all)
        if (r.name == "gflow" && (!best || r.s.median < best->s.median)) best = &r;
      if (best) std::fprintf(stderr, "best gflow threshold for %s on %d ranks: %zu B (%.3f ms)\n", layout_name.c_str(), P, best->threshold, best->s.median * 1e3);
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
