// bench/simulate.sh --local-work gpu-h200 only (built with smpicxx, never with the normal build):
// charges each simulated iteration a GPU's time for the scheme's own work, from the table that
// GFLOW_SIM_GPU_TIMES names (bench/platforms/h200_local_work.tsv: the H200's measured one-rank
// exchange times), with smpi_execute, while SMPI charges nothing for what this host computes
// (smpi/simulate-computation:no). What it leaves out: the work that grows with P (GTopK's merges
// at each tree level, OkTopK's per-peer split and checks), which a one-rank run does not do.
// The benchmark calls gflow_sim_local_work at the start of each timed iteration (bench/sparse.hpp).
#include <smpi/smpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {
struct row {
  std::size_t elements;
  std::string scheme;
  double density, ms;
};
const std::vector<row>* table() {  // nullptr: --local-work is not a GPU's
  static const std::vector<row>* t = []() -> const std::vector<row>* {
    const char* path = std::getenv("GFLOW_SIM_GPU_TIMES");
    if (path == nullptr || path[0] == '\0') return nullptr;
    std::ifstream in(path);
    if (!in) {
      std::fprintf(stderr, "bench/simulate.sh: GFLOW_SIM_GPU_TIMES: cannot read '%s'\n", path);
      std::exit(2);
    }
    auto* rows = new std::vector<row>;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream f(line);
      row r;
      if (!(f >> r.elements >> r.scheme >> r.density >> r.ms)) {
        std::fprintf(stderr, "bench/simulate.sh: %s: a row is pool_elements scheme density median_ms run, got '%s'\n", path, line.c_str());
        std::exit(2);
      }
      rows->push_back(r);
    }
    return rows;
  }();
  return t;
}
}  // namespace

// Seconds charged to this iteration: the mean of the table's rows for (pool elements, scheme,
// density); -1 when the table has none (nothing charged); NaN when no table is in use.
extern "C" double gflow_sim_local_work(const char* scheme, double density, std::size_t elements) {
  const auto* t = table();
  if (t == nullptr) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  int n = 0;
  for (const auto& r : *t)
    if (r.elements == elements && r.scheme == scheme && std::fabs(r.density - density) <= 1e-9 * density) {
      sum += r.ms;
      ++n;
    }
  if (n == 0) return -1.0;
  const double s = sum / n / 1e3;
  smpi_execute(s);
  return s;
}
