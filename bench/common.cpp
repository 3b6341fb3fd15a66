// gflow_bench's shared code: options, layouts, statistics (common.hpp).
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace gflow_bench {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gflow_bench: %s\n"
               "usage: bench/run exchange|overlap [--ranks N] [--layout NAME|PATH] [--threshold BYTES] [--wire fp32|fp16|bf16]\n"
               "                          [--quick] [--sweep] [--iters N] [--warmup N] [--compute-ratio R[,R...]] [--trace FILE]\n"
               "                          [--order shuffled|rotated]   (exchange: the variants' order each iteration)\n"
               "                          [--options]   (exchange: also gflow with find_unused, uneven_inputs, learn_order)\n"
               "                          [--shard]     (exchange: also Sharding<ReduceScatter>: the reduce-scatter alone, and with gather_shards;\n"
               "                                         overlap: also every strategy with Sharding<ReduceScatter>)\n"
               "       bench/run overlap --learn-order   (also each strategy with exchange_options::learn_order; the simulated backward\n"
               "                          marks tensors in <layout>.order when that file exists, e.g. --layout shared_late)\n"
               "       bench/run overlap --autotune [--compute-ratio 0.5,1,2] [--topology hybrid]   (fixed-threshold sweep + Fusion<Auto>,\n"
               "                          timed in interleaved rounds (--iters / 3 rounds of 1 + 3 iterations each);\n"
               "                          hybrid: Hybrid<1 MiB, 2> with the switch at all-ring / 1 MiB / all-hierarchical, tuned too)\n"
               "       bench/run model [--ranks N] [--layout L] [--reps N]       (alpha-beta fit, predictions P = 2..1024, error at N)\n"
               "       bench/run sparse [--ranks N] [--layout L] [--density 0.001,0.01] [--transport mpi|inproc] [--gradients repeated|fresh]\n"
               "                          [--variants dense,TopK,GTopK,OkTopK,OkTopK-shard,CSC]   (sparse: only these schemes; default all)\n"
               "                          [--variable-window N]   (sparse over MPI: all_to_allv / all_gatherv with N peers in flight;\n"
               "                                                   0: the MPI library's MPI_Alltoallv / MPI_Allgatherv)\n"
               "       bench/run kernels [--layout L1,L2 (default resnet50,gpt2_small)] [--iters N] [--warmup N]\n",
               why.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

namespace {

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

}  // namespace

std::vector<std::string> split_commas(const std::string& v) {
  std::vector<std::string> parts;
  for (std::size_t p0 = 0; p0 <= v.size();) {
    const std::size_t c = v.find(',', p0);
    parts.push_back(v.substr(p0, c == std::string::npos ? std::string::npos : c - p0));
    if (c == std::string::npos) break;
    p0 = c + 1;
  }
  return parts;
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
      for (const auto& r : split_commas(next())) o.compute_ratios.push_back(std::stod(r));
      o.compute_ratio = o.compute_ratios.front();
    }
    else if (a == "--trace") o.trace = next();
    else if (a == "--autotune") o.autotune = true;
    else if (a == "--learn-order") o.learn_order = true;
    else if (a == "--options") o.loop_options = true;
    else if (a == "--shard") o.shard = true;
    else if (a == "--reps") o.reps = std::stoi(next());
    else if (a == "--density") {
      o.densities.clear();
      for (const auto& d : split_commas(next())) o.densities.push_back(std::stod(d));
    } else if (a == "--variants") {
      o.variants = split_commas(next());
      for (const auto& n : o.variants)
        if (n != "dense" && n != "TopK" && n != "GTopK" && n != "OkTopK" && n != "OkTopK-shard" && n != "CSC")
          usage("--variants takes a list of dense, TopK, GTopK, OkTopK, OkTopK-shard, CSC, got '" + n + "'");
    } else if (a == "--transport") o.transport = next();
    else if (a == "--variable-window") {
      o.variable_window = std::stoi(next());
      if (o.variable_window < 0) usage("--variable-window takes 0 (the MPI library's collectives) or a positive number of peers in flight");
    }
    else if (a == "--gradients") {
      const std::string g = next();
      if (g != "repeated" && g != "fresh") usage("--gradients must be repeated (the same values every iteration) or fresh (new ones every iteration), got '" + g + "'");
      o.fresh_gradients = g == "fresh";
    }
    else if (a == "--topology") {
      const std::string v = next();
      if (v == "all") o.topologies = true;
      else if (v == "hybrid") o.hybrid = true;
      else if (v != "ring")
        usage("--topology takes ring, all (exchange: ring + Hierarchical<2>, <4>, from 16 ranks <8>, from 32 <16> + Hybrid<1 MiB, 2>, from 16 ranks Hybrid<1 MiB, 8>) or hybrid (overlap --autotune: Hybrid<1 MiB, 2>)");
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

double paired_median(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = a[i] / b[i];
  return summarize(std::move(r)).median;
}

}  // namespace gflow_bench
