#pragma once
// What the sparse suite (bench/sparse.cpp, bench/sparse.hpp) reports beyond the time, per exchanger, written
// apart so the suite itself changes by a few lines (issue 24):
//   result_entries(ex)   entries in the applied result: exchanged().size() for the Top-k family
//                        and OkTopK (host memory), every pool element for Dense and CSC
//   sent_bytes(...)      bytes one rank sends on the wire per iteration, every round, on the
//                        algorithms of a ring / direct exchange: Dense's ring allreduce
//                        2 (P-1)/P of the buffer; TopK's all_gather (P-1) x its message; GTopK's
//                        tree sends plus one broadcast message (wire_bytes already counts both);
//                        OkTopK's own count (wire_bytes: every round, see engines/oktopk/engine.hpp);
//                        CSC's two ring allreduces 2 (P-1)/P of what it hands over
//   reestimations(ex)    OkTopK: (exact local selections, boundary estimates, exact global top-k,
//                        full second passes) of the last iteration; zeros for the others
#include <array>
#include <cstddef>
#include <string>

namespace gflow_bench {

template <class Ex>
std::size_t result_entries(const Ex& ex, std::size_t pool_elements) {
  if constexpr (requires { ex.sparsifier().exchanged(); }) return ex.sparsifier().exchanged().size();
  else return pool_elements;
}

inline double sent_bytes(const std::string& name, std::size_t wire_bytes, int P) {
  const double b = static_cast<double>(wire_bytes), p = P;
  if (P <= 1) return 0.0;
  if (name == "TopK") return b * (p - 1.0);
  if (name == "GTopK" || name == "OkTopK" || name == "OkTopK-shard") return b;
  return b * 2.0 * (p - 1.0) / p;  // dense, CSC: ring allreduces
}

template <class Ex>
std::array<std::size_t, 4> reestimations(const Ex& ex) {
  if constexpr (requires { ex.sparsifier().reestimated(); }) {
    const auto r = ex.sparsifier().reestimated();
    return {r.local, r.boundary, r.global, r.second_pass};
  } else {
    return {0, 0, 0, 0};
  }
}

}  // namespace gflow_bench
