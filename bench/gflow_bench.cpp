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
#include <gflow/plan/cost_model.hpp>
#include <gflow/timeline.hpp>
#include <gflow/kernels/cast.hpp>
#include <gflow/kernels/sparse_chunks.hpp>
#include <gflow/kernels/topk.hpp>
#include <gflow/plan/density.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mpi.hpp>

#include "sparse_oktopk.hpp"
#include "suites.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <gflow/plan/buckets.hpp>
#include <gflow/plan/pool.hpp>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
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
  bool rotated = false;  // exchange: --order rotated (the variants' order before 2026-11-24) instead of shuffled
  double compute_ratio = 1.5;  // overlap: simulated backward time / measured exchange time
  std::vector<double> densities{0.001, 0.01};  // sparse
  std::string transport = "mpi";               // sparse: mpi or inproc
  bool topologies = false;                     // exchange: also Hierarchical<2|4> and Hybrid
  bool hybrid = false;                         // overlap --autotune --topology hybrid: Hybrid<1 MiB, 2>, switch tuned too
  int ranks = 0;                               // inproc: thread ranks
  int iters = 0, warmup = 0;
  std::string trace;                            // exchange / overlap: write a Chrome trace here
  bool autotune = false;                        // overlap: threshold sweep + Fusion<Auto>
  std::vector<double> compute_ratios;           // overlap --autotune: several ratios in one run
  int reps = 5;                                 // model: repetitions per size
  bool learn_order = false;                     // overlap: also each strategy with exchange_options::learn_order
  bool loop_options = false;                    // exchange --options: gflow with find_unused / uneven_inputs / learn_order
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gflow_bench: %s\n"
               "usage: bench/run exchange|overlap [--ranks N] [--layout NAME|PATH] [--threshold BYTES] [--wire fp32|fp16|bf16]\n"
               "                          [--quick] [--sweep] [--iters N] [--warmup N] [--compute-ratio R[,R...]] [--trace FILE]\n"
               "                          [--order shuffled|rotated]   (exchange: the variants' order each iteration)\n"
               "                          [--options]   (exchange: also gflow with find_unused, uneven_inputs, learn_order)\n"
               "       bench/run overlap --learn-order   (also each strategy with exchange_options::learn_order; the simulated backward\n"
               "                          marks tensors in <layout>.order when that file exists, e.g. --layout shared_late)\n"
               "       bench/run overlap --autotune [--compute-ratio 0.5,1,2] [--topology hybrid]   (fixed-threshold sweep + Fusion<Auto>,\n"
               "                          timed in interleaved rounds (--iters / 3 rounds of 1 + 3 iterations each);\n"
               "                          hybrid: Hybrid<1 MiB, 2> with the switch at all-ring / 1 MiB / all-hierarchical, tuned too)\n"
               "       bench/run model [--ranks N] [--layout L] [--reps N]       (alpha-beta fit, predictions P = 2..1024, error at N)\n"
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
    else if (a == "--order") {
      const std::string v = next();
      if (v == "rotated") o.rotated = true;
      else if (v != "shuffled") usage("--order takes shuffled (the default: a new random order of the variants every iteration) or rotated");
    }
    else if (a == "--compute-ratio") {
      o.compute_ratios.clear();
      std::string v = next();
      for (std::size_t p0 = 0; p0 <= v.size();) {
        const std::size_t c = v.find(',', p0);
        o.compute_ratios.push_back(std::stod(v.substr(p0, c == std::string::npos ? std::string::npos : c - p0)));
        if (c == std::string::npos) break;
        p0 = c + 1;
      }
      o.compute_ratio = o.compute_ratios.front();
    }
    else if (a == "--trace") o.trace = next();
    else if (a == "--autotune") o.autotune = true;
    else if (a == "--learn-order") o.learn_order = true;
    else if (a == "--options") o.loop_options = true;
    else if (a == "--reps") o.reps = std::stoi(next());
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
      else if (v == "hybrid") o.hybrid = true;
      else if (v != "ring")
        usage("--topology takes ring, all (exchange: ring + Hierarchical<2>, <4> + Hybrid<1 MiB, 2>) or hybrid (overlap --autotune: Hybrid<1 MiB, 2>)");
    }
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--ranks") o.ranks = std::stoi(next());  // MPI ranks are bench/run's business
    else usage("unknown option '" + a + "'");
  }
  if (o.suite != "exchange" && o.suite != "overlap" && o.suite != "sparse" && o.suite != "kernels" && o.suite != "model")
    usage("unknown suite '" + o.suite + "' (available: exchange, overlap, sparse, kernels, model)");
  if (o.compute_ratios.empty()) o.compute_ratios.push_back(o.compute_ratio);
  if (o.hybrid && !(o.suite == "overlap" && o.autotune)) usage("--topology hybrid is for overlap --autotune (exchange takes --topology all)");
  if (o.compute_ratios.size() > 1 && !o.autotune) usage("several --compute-ratio values need --autotune (the sweep runs them in one invocation)");
  for (double r : o.compute_ratios)
    if (!(r >= 0)) usage("--compute-ratio values must be >= 0");
  if (o.reps < 3) usage("--reps must be at least 3");
  if (!o.trace.empty() && o.suite != "exchange" && o.suite != "overlap") usage("--trace is for the exchange and overlap suites");
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

std::string layout_path(const std::string& name) {
  if (name.find('/') != std::string::npos || name.find(".tsv") != std::string::npos) return name;
  return std::string(GFLOW_LAYOUT_DIR) + "/" + name + ".tsv";
}
gflow::Layout load_layout(const std::string& name) { return gflow::Layout::from_tsv(layout_path(name)); }

// The order the simulated backward marks gradients ready: the tensor names of <layout>.order
// beside the .tsv, first ready first (a model whose backward is not the reverse of its forward
// order, e.g. bench/layouts/shared_late), else the reverse of the layout's order. Set once in main.
std::vector<std::size_t> g_backward_order;
std::vector<std::size_t> backward_order(const gflow::Layout& l, const std::string& name) {
  std::string path = layout_path(name);
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".tsv") == 0) path.replace(path.size() - 4, 4, ".order");
  std::vector<std::size_t> order;
  std::ifstream f(path);
  if (!f) {
    for (std::size_t k = l.size(); k-- > 0;) order.push_back(k);
    return order;
  }
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < l.size(); ++i) index[l[i].name] = i;
  std::vector<bool> seen(l.size(), false);
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto it = index.find(line);
    if (it == index.end() || seen[it->second]) usage(path + ": '" + line + "' is not a tensor of the layout, or is named twice");
    seen[it->second] = true;
    order.push_back(it->second);
  }
  if (order.size() != l.size()) usage(path + " names " + std::to_string(order.size()) + " of the layout's " + std::to_string(l.size()) + " tensors");
  return order;
}

// ---- hand-written baselines ---------------------------------------------------------------------
// The hand-written loop uses gflow's casts and 16-bit sum kernel (SIMD where the CPU has it), as a
// careful hand-written exchange would: the comparison is about the exchange around them.
template <class W>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  gflow::kernels::combine_wire<gflow::reduce_op::sum>(static_cast<const W*>(in), static_cast<W*>(inout), static_cast<std::size_t>(*len));
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

// The median over paired samples of a[i] / b[i] (iterations or rounds measured seconds apart, so a
// drift of the machine cancels).
double paired_median(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = a[i] / b[i];
  return summarize(std::move(r)).median;
}

template <class E>
using on_mpi = typename E::template on<gflow::mpi::transport>;

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
  // Another exchanger over the same pool contents, timed like gflow (every tensor ready, finish).
  auto add_exchanger = [&](auto* e, const char* name) {
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
    add_topology(hy, "gflow_hybrid1M_2");
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
  // With a 16-bit wire, the fp32 exchange of the same pool in the same run (bench/run exchange
  // --wire fp16 reports gflow / gflow_fp32).
  using E32 = gflow::Exchanger<gflow::Precision<gflow::wire::fp32>, gflow::Fusion<(4u << 20)>>;
  std::optional<on_mpi<E32>> ex32;
  if constexpr (!std::is_same_v<Wire, gflow::wire::fp32>) {
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
  eo.threshold_bytes = o.threshold;
  eo.learn_order = learn_order;  // learns from the first iteration's order: the backward's (below)
  typename E::template on<gflow::mpi::transport> ex(tr, l, eo);
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
    gflow::exchange_options eo;
    eo.threshold_bytes = 4u << 20;
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
          gflow::exchange_options fo;
          fo.threshold_bytes = plans[v].th;
          Fixed fixed(tr, l, fo);
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
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Funneled>>>("Funneled", o, l, per_elem, !o.trace.empty()));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>", o, l, per_elem));
  rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Chained>>>("Chained", o, l, per_elem));
  if (o.learn_order) {  // the same strategies with the pool laid out in the observed backward order
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::None>>>("None+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Funneled>>>("Funneled+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Concurrent<2>>>>("Concurrent<2>+learn", o, l, per_elem, false, true));
    rs.push_back(run_overlap_variant<gflow::Exchanger<Pr, Fu, Overlap<gflow::Chained>>>("Chained+learn", o, l, per_elem, false, true));
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
  std::size_t entries = 0;                   // entries in the result (sparse_oktopk.hpp)
  std::array<std::size_t, 4> reest{};        // OkTopK's re-estimations over the measured iterations
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
  std::size_t bytes = 0, entries = 0;
  std::array<std::size_t, 4> reest{};
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    t.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t q = l.size(); q-- > 0;) ex.ready(q);
    auto status = ex.finish();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes = status.wire_bytes;
    entries = gflow_bench::result_entries(ex, total);
    if (it >= o.warmup)
      for (std::size_t j = 0; j < 4; ++j) reest[j] += gflow_bench::reestimations(ex)[j];
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
  return {name, density, summarize(tt), summarize(st), bytes, entries, reest};
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
    rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::OkTopK<0.01>>>>(t, o, l, "OkTopK", d, true, dens));
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
        "\"comm_s\":%.9g,\"comm_s_derived\":true,\"bytes_per_rank\":%zu,\"sent_bytes_per_rank\":%.0f,\"result_entries\":%zu,"
        "\"exact_local\":%zu,\"boundary_estimates\":%zu,\"exact_global\":%zu,\"second_passes\":%zu,\"pool_elements\":%zu,\"iterations\":%d}\n",
        layout_name.c_str(), P, o.transport.c_str(), r.name.c_str(), o.wire.c_str(), r.name == "dense" ? o.threshold : std::size_t{0}, r.density,
        r.total.median, r.total.p10, r.total.p90, r.select.median, comm, r.wire_bytes, gflow_bench::sent_bytes(r.name, r.wire_bytes, P), r.entries,
        r.reest[0], r.reest[1], r.reest[2], r.reest[3], l.total_numel(), o.iters);
  }
  std::fflush(stdout);
}


// ---- suite model: the alpha-beta cost model ------------------------------------------------------
// 1. times each collective kind the exchanges use (allreduce, all_gather, send/recv, broadcast)
//    over sizes 4 KiB .. 16 MiB on this P, median of --reps, slowest rank;
// 2. fits alpha + beta * bytes per kind in its algorithm's shape (plan/cost_model.hpp);
// 3. checks the model against measured exchanges of the layout at this P (dense at --threshold,
//    Hierarchical<2>, TopK / GTopK at density 0.01 and 0.001 (communication = total minus the
//    selection, as in the sparse suite), CSC at 1%) and reports the error;
// 4. predicts those exchanges for P = 2 .. 1024 from the fit.
template <class F>
double time_median(int reps, F&& f) {
  std::vector<double> ts;
  for (int r = 0; r < reps + 2; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 1) ts.push_back(dt);  // the first two are warm-up (first-touch, protocol set-up)
  }
  return summarize(ts).median;
}

// The engines' local work per unit (plan::local_costs), timed with their own kernels on every
// rank at once (median of reps, slowest rank): pool-sized passes over `elements`, and the
// per-entry work on k received entries of a d = 0.01 exchange.
gflow::plan::local_costs measure_local_costs(int reps, std::size_t elements, std::size_t bucket_elements, std::size_t k, int rank) {
  namespace kn = gflow::kernels;
  const double n = static_cast<double>(elements), kd = static_cast<double>(std::max<std::size_t>(k, 1));
  std::vector<float> g(elements), res(elements, 0.0f), hist(elements, 0.0f);
  for (std::size_t i = 0; i < elements; ++i)
    g[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 20011)) / 10000.0f - 1.0f;
  std::vector<float> pool = g;
  gflow::plan::local_costs c;
  {  // Dense averages each bucket right after its allreduce, while it is still in cache
    const std::size_t b = std::min(elements, bucket_elements);
    constexpr int passes = 8;
    (void)kn::scale_in_place(pool.data(), b, 1.0f);
    c.average = time_median(reps, [&] {
                  for (int r = 0; r < passes; ++r) (void)kn::scale_in_place(pool.data(), b, 1.0f);
                }) / (passes * static_cast<double>(b));
  }
  c.zero = time_median(reps, [&] { std::fill(pool.begin(), pool.end(), 0.0f); }) / n;
  kn::topk_workspace ws;
  ws.reserve(elements, k);
  std::vector<std::uint32_t> out(k);
  const double acc = time_median(reps, [&] { (void)kn::accumulate_select_topk(g.data(), res.data(), elements, k, 0, out.data(), ws); });
  const double sel = time_median(reps, [&] { (void)kn::select_topk_sampled(g.data(), elements, k, 0, out.data(), ws); });
  c.accumulate = std::max(0.0, acc - sel) / n;
  constexpr std::size_t C = 32768;
  std::vector<std::uint32_t> chunks((elements + C - 1) / C);
  std::iota(chunks.begin(), chunks.end(), std::uint32_t{0});
  std::vector<float> norms(chunks.size());
  pool = g;
  c.defer = time_median(reps, [&] { kn::defer_chunks(pool.data(), hist.data(), elements, C, chunks.data(), chunks.size(), 0.9f, norms.data()); }) / n;
  // Two lists of k sorted, distinct indices drawn at random over the pool (a fixed seed; the
  // branches of the merges are as unpredictable as with real selections).
  std::mt19937_64 rng(12345);
  auto random_list = [&](std::vector<std::uint32_t>& idx) {
    std::vector<std::uint32_t> all(std::min<std::size_t>(elements, 4 * k + 1));
    for (auto& x : all) x = static_cast<std::uint32_t>(rng() % elements);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min(all.size(), k));
    std::sort(all.begin(), all.end());
    idx = std::move(all);
  };
  std::vector<std::uint32_t> ia, ib;
  random_list(ia);
  random_list(ib);
  const std::size_t ka = ia.size(), kb = ib.size();
  std::vector<float> va(ka), vb(kb);
  for (std::size_t j = 0; j < ka; ++j) va[j] = g[j];
  for (std::size_t j = 0; j < kb; ++j) vb[j] = g[elements - 1 - j];
  // TopK's per-entry work on a received message: validated, decoded (twice: check all P first,
  // then apply), scatter-added, then averaged and counted where the union holds a value.
  std::vector<unsigned char> msg(gflow::sparse_message::bytes(k, 4, 4));
  gflow::sparse_message::pack(msg.data(), k, ia.data(), va.data(), ka);
  std::vector<std::uint32_t> ri2(k);
  std::vector<float> rv2(k), dec(k);
  c.entry = time_median(reps, [&] {
              (void)kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
              const auto r = kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
              kn::scatter_add(pool.data(), ri2.data(), rv2.data(), r.count);
              kn::scale_at(pool.data(), ri2.data(), r.count, 1.0f, dec.data());
              (void)kn::count_nonfinite(dec.data(), r.count);
            }) / kd;
  // the union as the engine forms it: each received list marked in a two-level bitmap of the
  // pool, then read out in index order (which clears it)
  std::vector<std::uint64_t> marks((elements + 63) / 64, 0), summary((elements + 4095) / 4096, 0), uo(ka + kb);
  auto mark_both = [&] {
    kn::mark_bits(marks.data(), summary.data(), ia.data(), ka, 0);
    kn::mark_bits(marks.data(), summary.data(), ib.data(), kb, 0);
  };
  const double t_mark = time_median(reps, mark_both);
  const std::size_t u = kn::take_marked(marks.data(), summary.data(), summary.size(), 0, uo.data());
  const double t_union = time_median(reps, [&] {
    mark_both();
    (void)kn::take_marked(marks.data(), summary.data(), summary.size(), 0, uo.data());
  });
  c.union_mark = t_mark / static_cast<double>(ka + kb);
  c.union_emit = std::max(0.0, t_union - t_mark) / static_cast<double>(std::max<std::size_t>(u, 1));
  std::vector<std::uint32_t> oi(k), ri(2 * k), midx(2 * k), mkey(2 * k);
  std::vector<float> ov(k), rv(2 * k), msum(2 * k);
  std::size_t records = 0;
  // In GTopK's first merge round half the ranks merge while the others wait (later rounds: fewer):
  // on a host whose ranks share cores that is the load to measure the merge under.
  const bool merges = rank % 2 == 0;
  c.merge_step = time_median(reps, [&] {
                   if (!merges) return;
                   const auto r = kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
                   (void)kn::merge_topk(ri2.data(), rv2.data(), r.count, ib.data(), vb.data(), kb, k, oi.data(), ov.data(), ri.data(), rv.data(), &records,
                                        kn::merge_scratch<std::uint32_t>{midx.data(), msum.data(), mkey.data()});
                 }) / static_cast<double>(ka + kb);
  return c;
}

void run_model_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  namespace pl = gflow::plan;
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (P < 2) {
    if (rank == 0) std::fprintf(stderr, "gflow_bench: the model suite fits collectives: run it on 2 or more ranks (--ranks 2)\n");
    return;
  }
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  const std::vector<std::size_t> sizes{4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20};
  // allreduce / broadcast read and write a region the size of the layout's pool (at least 64 MiB),
  // a different part each time: data an exchange streams from memory, not a buffer left in cache.
  const std::size_t region = std::max<std::size_t>(l.total_numel(), (64u << 20) / 4);
  std::vector<float> buf(region, 0.0f);
  std::size_t cursor = 0;
  auto next = [&](std::size_t n) {  // n bytes of buf, after the last ones handed out
    if ((cursor + n) / 4 > region) cursor = 0;
    float* p = buf.data() + cursor / 4;
    cursor += n;
    return p;
  };
  std::vector<std::uint8_t> bytes_in(16u << 20, 1), gathered((4u << 20) * static_cast<std::size_t>(P));
  struct sample {
    pl::collective_kind kind;
    double bytes, seconds;
  };
  std::vector<sample> samples;
  for (std::size_t n : sizes) {
    samples.push_back({pl::collective_kind::allreduce, double(n), time_median(o.reps, [&] { tr.all_reduce(next(n), n / 4, gflow::reduce_op::sum); })});
    if (n <= (4u << 20))
      samples.push_back({pl::collective_kind::all_gather, double(n), time_median(o.reps, [&] { tr.all_gather(bytes_in.data(), gathered.data(), n); })});
    samples.push_back({pl::collective_kind::broadcast, double(n), time_median(o.reps, [&] { tr.broadcast(reinterpret_cast<std::uint8_t*>(next(n)), n, 0); })});
    // one message, rank 0 <-> rank 1 ping-pong: half the round trip
    samples.push_back({pl::collective_kind::send_recv, double(n), 0.5 * time_median(o.reps, [&] {
                         if (rank == 0) {
                           tr.send(bytes_in.data(), n, 1);
                           tr.recv(bytes_in.data(), n, 1);
                         } else if (rank == 1) {
                           tr.recv(bytes_in.data(), n, 0);
                           tr.send(bytes_in.data(), n, 0);
                         }
                       })});
    if (rank == 0) std::fprintf(stderr, "  collectives of %zu B timed\n", n);
  }
  pl::cost_model m;
  for (auto k : {pl::collective_kind::allreduce, pl::collective_kind::all_gather, pl::collective_kind::send_recv, pl::collective_kind::broadcast}) {
    std::vector<double> x, y;
    for (const auto& s : samples)
      if (s.kind == k) {
        x.push_back(s.bytes);
        y.push_back(s.seconds);
      }
    const pl::kind_fit f = pl::fit_kind_regimes(k, k == pl::collective_kind::send_recv ? 2 : P, x, y);
    (k == pl::collective_kind::allreduce ? m.allreduce : k == pl::collective_kind::all_gather ? m.all_gather
                                                     : k == pl::collective_kind::send_recv  ? m.send_recv
                                                                                            : m.broadcast) = f;
  }
  if (rank == 0) {
    std::fprintf(stderr, "%-11s %12s %16s %12s %12s %16s %14s\n", "kind", "alpha_us", "beta_ns_per_B", "split_B", "alpha2_us", "beta2_ns_per_B",
                 "fit_max_err");
    for (auto k : {pl::collective_kind::allreduce, pl::collective_kind::all_gather, pl::collective_kind::send_recv, pl::collective_kind::broadcast}) {
      double worst = 0;
      for (const auto& s : samples)
        if (s.kind == k) {
          const double pred = m.collective(k, k == pl::collective_kind::send_recv ? 2 : P, s.bytes);
          const double err = pred / s.seconds - 1.0;
          worst = std::max(worst, std::abs(err));
          std::printf("{\"suite\":\"model\",\"row\":\"sample\",\"ranks\":%d,\"kind\":\"%s\",\"bytes\":%.0f,\"measured_s\":%.9g,\"predicted_s\":%.9g,\"error\":%.4f}\n", P,
                      pl::collective_kind_name(k), s.bytes, s.seconds, pred, err);
        }
      const auto& f = m.of(k);  // alpha_s / beta_s_per_byte: below split_bytes (0: one regime); *_large: from split_bytes on
      const double split = f.split_in_two() ? f.split : 0.0;
      std::fprintf(stderr, "%-11s %12.2f %16.4f %12.0f %12.2f %16.4f %13.1f%%\n", pl::collective_kind_name(k), f.small.alpha * 1e6, f.small.beta * 1e9, split,
                   f.large.alpha * 1e6, f.large.beta * 1e9, worst * 100);
      std::printf("{\"suite\":\"model\",\"row\":\"fit\",\"ranks\":%d,\"kind\":\"%s\",\"alpha_s\":%.9g,\"beta_s_per_byte\":%.9g,\"split_bytes\":%.0f,"
                  "\"alpha_large_s\":%.9g,\"beta_large_s_per_byte\":%.9g,\"fit_max_error\":%.4f}\n",
                  P, pl::collective_kind_name(k), f.small.alpha, f.small.beta, split, f.large.alpha, f.large.beta, worst);
    }
  }
  const std::size_t total = l.total_numel();
  const pl::exchange_model em{m, measure_local_costs(o.reps, total, o.threshold / 4, pl::k_for(0.01, total), rank)};
  if (rank == 0) {
    const auto& c = em.local;
    std::fprintf(stderr, "local work (ns): average %.3f, zero %.3f, accumulate %.3f, defer %.3f per element; entry %.2f, union mark %.2f, union emit %.2f, merge %.2f\n",
                 c.average * 1e9, c.zero * 1e9, c.accumulate * 1e9, c.defer * 1e9, c.entry * 1e9, c.union_mark * 1e9, c.union_emit * 1e9,
                 c.merge_step * 1e9);
    std::printf("{\"suite\":\"model\",\"row\":\"local\",\"ranks\":%d,\"elements\":%zu,\"average_s\":%.6g,\"zero_s\":%.6g,\"accumulate_s\":%.6g,"
                "\"defer_s\":%.6g,\"entry_s\":%.6g,\"union_mark_s\":%.6g,\"union_emit_s\":%.6g,\"merge_s\":%.6g}\n",
                P, total, c.average, c.zero, c.accumulate, c.defer, c.entry, c.union_mark, c.union_emit, c.merge_step);
  }
  // ---- measured exchanges of the layout -----------------------------------------------------------
  options so = o;
  so.iters = std::max(o.iters, 7);
  std::vector<double> bucket_bytes;
  {
    const auto pool = pl::plan_pool(l);
    for (const auto& b : pl::plan_buckets(l, pool, {4, o.threshold, 0})) bucket_bytes.push_back(double(b.count * 4));
  }
  struct check {
    std::string name;
    double measured, predicted, comm;  // predicted = comm + local work
  };
  std::vector<check> checks;
  using gflow::Exchanger;
  using gflow::Sparsifier;
  auto fuse = [&](auto& ex) { ex.set_fusion(o.threshold); };
  {
    auto r = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>>>(tr, so, l, "dense", 1.0, false, fuse);
    checks.push_back({"dense", r.total.median, em.dense(P, bucket_bytes, total), m.dense(P, bucket_bytes)});
  }
  if (P >= 4 && P % 2 == 0) {
    auto r = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, gflow::Topology<gflow::Hierarchical<2>>>>(tr, so, l, "hierarchical2", 1.0, false, fuse);
    checks.push_back({"hierarchical2", r.total.median, em.hierarchical(P, 2, bucket_bytes, total), m.hierarchical(P, 2, bucket_bytes)});
  }
  for (double d : {0.01, 0.001}) {
    const std::size_t k = pl::k_for(d, total);
    auto dens = [d](auto& ex) { ex.sparsifier().set_density(d); };
    auto a = measure_sparse<Exchanger<Sparsifier<gflow::TopK<0.01>>>>(tr, so, l, "TopK", d, true, dens);
    checks.push_back({"topk_" + std::to_string(d).substr(0, 5), a.total.median - a.select.median, em.topk(P, k, 8, total), m.topk(P, k, 8)});
    auto g = measure_sparse<Exchanger<Sparsifier<gflow::GTopK<0.01>>>>(tr, so, l, "GTopK", d, true, dens);
    checks.push_back({"gtopk_" + std::to_string(d).substr(0, 5), g.total.median - g.select.median, em.gtopk(P, k, 8, total), m.gtopk(P, k, 8)});
    // OkTopK's selection is its own threshold pass (about one accumulation pass), so its whole time is checked.
    auto ok = measure_sparse<Exchanger<Sparsifier<gflow::OkTopK<0.01>>>>(tr, so, l, "OkTopK", d, false, dens);
    checks.push_back({"oktopk_" + std::to_string(d).substr(0, 5), ok.total.median, em.oktopk(P, k, 8, total) + em.local.accumulate * static_cast<double>(total),
                      m.oktopk(P, k, 8)});
  }
  {
    auto c = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, Sparsifier<gflow::CSC<32768, 15>>>>(tr, so, l, "CSC", 0.01, false, [&](auto& ex) {
      ex.set_fusion(o.threshold);
      ex.sparsifier().set_percent(1);
      ex.sparsifier().set_warmup(0, 0);
    });
    checks.push_back({"csc_1pct", c.total.median, em.csc(P, total, 32768, 0.01, 4), m.csc(P, total, 32768, 0.01, 4)});
  }
  if (rank != 0) return;
  std::fprintf(stderr, "%-14s %12s %12s %9s %12s %10s\n", "exchange", "measured_ms", "model_ms", "error", "comm_ms", "comm_err");
  for (const auto& c : checks) {
    const double err = c.predicted / c.measured - 1.0, cerr = c.comm / c.measured - 1.0;
    std::fprintf(stderr, "%-14s %12.2f %12.2f %8.1f%% %12.2f %9.1f%%\n", c.name.c_str(), c.measured * 1e3, c.predicted * 1e3, err * 100, c.comm * 1e3,
                 cerr * 100);
    std::printf("{\"suite\":\"model\",\"row\":\"check\",\"layout\":\"%s\",\"ranks\":%d,\"exchange\":\"%s\",\"measured_s\":%.9g,\"predicted_s\":%.9g,\"error\":%.4f,"
                "\"comm_s\":%.9g,\"comm_error\":%.4f}\n",
                layout_name.c_str(), P, c.name.c_str(), c.measured, c.predicted, err, c.comm, cerr);
  }
  // ---- predictions beyond this machine ------------------------------------------------------------
  std::fprintf(stderr, "%6s %12s %12s %12s %12s %12s %12s %12s %12s\n", "P", "dense_ms", "hier8_ms", "topk1%_ms", "gtopk1%_ms", "gtopk.1%_ms", "oktopk1%_ms",
               "oktopk.1%_ms", "csc1%_ms");
  const std::size_t k1 = pl::k_for(0.01, total), k01 = pl::k_for(0.001, total);
  for (int q = 2; q <= 1024; q *= 2) {
    const double dn = em.dense(q, bucket_bytes, total), hi = em.hierarchical(q, 8, bucket_bytes, total), tk = em.topk(q, k1, 8, total),
                 gk = em.gtopk(q, k1, 8, total), gk01 = em.gtopk(q, k01, 8, total), cs = em.csc(q, total, 32768, 0.01, 4),
                 ok = em.oktopk(q, k1, 8, total), ok01 = em.oktopk(q, k01, 8, total);
    std::fprintf(stderr, "%6d %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f\n", q, dn * 1e3, hi * 1e3, tk * 1e3, gk * 1e3, gk01 * 1e3, ok * 1e3,
                 ok01 * 1e3, cs * 1e3);
    std::printf("{\"suite\":\"model\",\"row\":\"predict\",\"layout\":\"%s\",\"fitted_at_ranks\":%d,\"ranks\":%d,\"dense_s\":%.9g,\"hierarchical8_s\":%.9g,"
                "\"topk_0.01_s\":%.9g,\"gtopk_0.01_s\":%.9g,\"topk_0.001_s\":%.9g,\"gtopk_0.001_s\":%.9g,\"oktopk_0.01_s\":%.9g,\"oktopk_0.001_s\":%.9g,"
                "\"csc_1pct_s\":%.9g}\n",
                layout_name.c_str(), P, q, dn, hi, tk, gk, em.topk(q, k01, 8, total), gk01, ok, ok01, cs);
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
  g_backward_order = backward_order(l, o.layout);
  std::string layout_name = o.layout;
  if (auto s = layout_name.find_last_of('/'); s != std::string::npos) layout_name = layout_name.substr(s + 1);
  if (auto d = layout_name.find(".tsv"); d != std::string::npos) layout_name = layout_name.substr(0, d);
  const std::size_t wbytes = o.wire == "fp32" ? 4 : 2;
  const std::size_t payload = l.total_numel() * wbytes;

  if (o.suite == "model") {
    if (rank == 0)
      std::fprintf(stderr, "gflow bench: suite model, layout %s, %d MPI ranks, %d repetitions per size, threshold %zu B\n", layout_name.c_str(), P, o.reps, o.threshold);
    run_model_suite(o, l, layout_name);
    MPI_Finalize();
    return 0;
  }
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
    if (o.autotune) {
      if (o.wire == "fp16") run_autotune_suite<gflow::wire::fp16>(o, l, layout_name);
      else if (o.wire == "bf16") run_autotune_suite<gflow::wire::bf16>(o, l, layout_name);
      else run_autotune_suite<gflow::wire::fp32>(o, l, layout_name);
      MPI_Finalize();
      return 0;
    }
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
    std::fprintf(stderr, "%-20s %14s %6s %12s %12s %12s %10s %8s %8s\n", "variant", "threshold_B", "colls", "median_ms", "p10_ms", "p90_ms", "vs_bucket",
                 "paired", o.wire == "fp32" ? "" : "vs_fp32");
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
      std::fprintf(stderr, "%-20s %14zu %6zu %12.3f %12.3f %12.3f %10s %8s %8s\n", r.name.c_str(), r.threshold, r.collectives, r.s.median * 1e3,
                   r.s.p10 * 1e3, r.s.p90 * 1e3, fmt(ratio).c_str(), fmt(r.paired_ratio).c_str(), fmt(vs32).c_str());
      std::printf(
          "{\"suite\":\"exchange\",\"layout\":\"%s\",\"ranks\":%d,\"variant\":\"%s\",\"wire\":\"%s\",\"threshold_bytes\":%zu,"
          "\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"bytes_per_rank\":%zu,\"collectives\":%zu,\"iterations\":%d%s%s%s}\n",
          layout_name.c_str(), P, r.name.c_str(), o.wire.c_str(), r.threshold, r.s.median, r.s.p10, r.s.p90,
          r.name == "gflow_fp32" ? l.total_numel() * 4 : payload, r.collectives, o.iters,
          ratio > 0 ? (",\"ratio_vs_mpi_bucketed\":" + std::to_string(ratio)).c_str() : "",
          r.paired_ratio > 0 ? (",\"paired_ratio_vs_mpi_bucketed\":" + std::to_string(r.paired_ratio)).c_str() : "",
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
