// gflow benchmark driver, one process per MPI rank; start it through bench/run.
// main() parses the options, loads the layout and runs one suite:
//   exchange  gflow against hand-written MPI on the same buffers (exchange.cpp)
//   overlap   the Overlap strategies under a simulated backward; --autotune (overlap.cpp)
//   sparse    dense against the sparsifiers (sparse.cpp)
//   model     the alpha-beta cost model: fit, check, predictions (model.cpp)
//   kernels   the host kernels against a copy, one process (kernels.cpp)
// Shared: options, layouts and statistics (common.hpp / common.cpp).
// Output: a table on stderr, one JSON object per variant on stdout (rank 0 only).
#include "common.hpp"

#include <cstddef>
#include <cstdio>
#include <string>

// bench/simulate.sh --fold folds the arrays shaped like this pool (bench/simulate_fold.cpp, linked
// only into the simulated build; absent elsewhere).
extern "C" __attribute__((weak)) void gflow_sim_fold_elements(std::size_t);

int main(int argc, char** argv) {
  using namespace gflow_bench;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // overlap suite: issuing threads
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const options o = parse(argc, argv);
  if (o.suite == "kernels") {
    int rc = 0;
    if (rank == 0) {
      kernels_options ko;
      ko.iters = o.iters;
      ko.warmup = o.warmup;
      try {
        for (const auto& name : split_commas(o.layout)) ko.sizes.push_back({name, load_layout(name).total_numel()});
        rc = run_kernels_suite(ko);
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
  if (gflow_sim_fold_elements != nullptr) gflow_sim_fold_elements(l.total_numel());
  g_backward_order = backward_order(l, o.layout);
  std::string layout_name = o.layout;
  if (auto s = layout_name.find_last_of('/'); s != std::string::npos) layout_name = layout_name.substr(s + 1);
  if (auto d = layout_name.find(".tsv"); d != std::string::npos) layout_name = layout_name.substr(0, d);
  int rc = 0;
  if (o.suite == "model") rc = run_model_suite(o, l, layout_name);
  else if (o.suite == "sparse") rc = run_sparse_suite(o, l, layout_name);
  else if (o.suite == "overlap") rc = run_overlap_suite(o, l, layout_name, provided);
  else rc = run_exchange_suite(o, l, layout_name);
  MPI_Finalize();
  return rc;
}
