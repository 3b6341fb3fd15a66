#pragma once
// The suites of gflow_bench that live in their own translation units.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace gflow_bench {

struct kernels_options {
  std::vector<std::pair<std::string, std::size_t>> sizes;  // (layout name, pool elements)
  int iters = 9, warmup = 1;
};

/// bench/run kernels: every host kernel against a same-run copy (bench/kernels.cpp).
int run_kernels_suite(const kernels_options& o);

}  // namespace gflow_bench
