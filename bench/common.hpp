#pragma once
// What the MPI suites of gflow_bench share (one translation unit per suite: exchange.cpp,
// overlap.cpp, sparse.cpp, model.cpp; kernels.cpp runs without MPI, see suites.hpp): the options
// and their parsing, the model layouts and the simulated backward's order, the statistics over
// timed iterations (median, p10, p90; paired ratios) and each suite's entry point.
// gflow_bench.cpp is main(): it parses the options, loads the layout and runs one suite.
#include <mpi.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "suites.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace gflow_bench {

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
  std::vector<std::string> variants;           // sparse: --variants (empty: every scheme)
  std::string transport = "mpi";               // sparse: mpi or inproc
  bool fresh_gradients = false;                // sparse/model: --gradients fresh (new values every iteration)
  int variable_window = -1;                    // sparse: --variable-window N (gflow::mpi::transport::set_variable_window; -1: the default)
  bool topologies = false;                     // exchange: also Hierarchical<2|4> and Hybrid
  bool hybrid = false;                         // overlap --autotune --topology hybrid: Hybrid<1 MiB, 2>, switch tuned too
  int ranks = 0;                               // inproc: thread ranks
  int iters = 0, warmup = 0;
  std::string trace;                            // exchange / overlap: write a Chrome trace here
  bool autotune = false;                        // overlap: threshold sweep + Fusion<Auto>
  std::vector<double> compute_ratios;           // overlap --autotune: several ratios in one run
  int reps = 5;                                 // model: repetitions per size
  bool learn_order = false;                     // overlap: also each strategy with exchange_options::learn_order
  bool shard = false;                           // exchange --shard: also Sharding<ReduceScatter> (gflow_shard, gflow_shard_gather)
  bool loop_options = false;                    // exchange --options: gflow with find_unused / uneven_inputs / learn_order
};

/// Prints why and the usage to stderr and ends every rank with exit code 2.
[[noreturn]] void usage(const std::string& why);
/// The command line (after MPI_Init): the suite, then its options; usage() on anything wrong.
options parse(int argc, char** argv);
// "a,b,c" -> {"a", "b", "c"} (the list options: --density, --compute-ratio, --variants, kernels' --layout)
std::vector<std::string> split_commas(const std::string& v);

/// A layout by name (bench/layouts/<name>.tsv) or by path.
std::string layout_path(const std::string& name);
gflow::Layout load_layout(const std::string& name);

// The order the simulated backward marks gradients ready: the tensor names of <layout>.order
// beside the .tsv, first ready first (a model whose backward is not the reverse of its forward
// order, e.g. bench/layouts/shared_late), else the reverse of the layout's order. Set once in main.
extern std::vector<std::size_t> g_backward_order;
std::vector<std::size_t> backward_order(const gflow::Layout& l, const std::string& name);

struct stats {
  double median, p10, p90;
};
/// Median, p10 and p90 (linear interpolation between the order statistics).
stats summarize(std::vector<double> v);
// The median over paired samples of a[i] / b[i] (iterations or rounds measured seconds apart, so a
// drift of the machine cancels).
double paired_median(const std::vector<double>& a, const std::vector<double>& b);

template <class E>
using on_mpi = typename E::template on<gflow::mpi::transport>;

// ---- the suites: each prints its table on stderr and its JSON lines on stdout (rank 0); the
// return value is main's exit code. layout_name: the layout's file name without .tsv.
int run_exchange_suite(const options& o, const gflow::Layout& l, const std::string& layout_name);
/// thread_level: what MPI_Init_thread provided (the overlap strategies need MPI_THREAD_MULTIPLE).
int run_overlap_suite(const options& o, const gflow::Layout& l, const std::string& layout_name, int thread_level);
int run_sparse_suite(const options& o, const gflow::Layout& l, const std::string& layout_name);
int run_model_suite(const options& o, const gflow::Layout& l, const std::string& layout_name);

}  // namespace gflow_bench
