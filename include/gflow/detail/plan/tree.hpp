#pragma once
// gTop-k tree schedule and the communication costs of gTop-k (Shi et al.)'s Table I (pure).
//
// Tree (gTop-k (Shi et al.) Algorithm 3, generalised to any P): ceil(log2 P) rounds. In round j
// (j = 0, 1, ...), rank r with r % 2^(j+1) == 0 receives from r + 2^j when that rank exists
// (r + 2^j < P) and merges; rank r with r % 2^(j+1) == 2^j sends to r - 2^j and is idle in
// every later round; every other rank is idle. After the last round rank 0 holds the global
// top-k and broadcasts it. With P a power of two this is exactly the paper's Fig. 4; otherwise
// the ranks without a partner in a round simply carry their list into the next round, so
// every rank's list reaches rank 0 through exactly one path.
//
// Table I (alpha: latency per message, beta: time per element, k = density * m):
//   DenseAllReduce   2(P-1) alpha + 2 (P-1)/P m beta
//   TopKAllReduce    log(P) alpha + 2 (P-1) k beta         (AllGather of k values + k indices)
//   gTopKAllReduce   2 log(P) alpha + 4 k log(P) beta      (log P rounds of 2k, broadcast of 2k)
// with log(P) read as ceil(log2 P) rounds where P is not a power of two. table1_cost() gives
// the coefficients; table1_bytes() turns the beta term into bytes with the actual element
// sizes: a "2k elements" term is k indices plus k values.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../error.hpp"

namespace gflow::detail::plan {

/// ceil(log2 P): the number of merge rounds of gTop-k over P ranks (0 for P = 1).
inline int gtopk_rounds(int ranks) {
  if (ranks < 1) throw invalid_argument("ranks", fmt::format("gTop-k needs at least one rank (got {}).", ranks), "pass the group size, >= 1.");
  int r = 0;
  while ((std::int64_t{1} << r) < ranks) ++r;
  return r;
}

enum class tree_role : std::uint8_t { idle, receive, send };

struct tree_step {
  int round = 0;
  tree_role role = tree_role::idle;
  int peer = -1;  // source (receive) or destination (send); -1 when idle
};

/// What `rank` does in round `round` of the gTop-k tree over `ranks` ranks.
inline tree_step gtopk_step(int rank, int ranks, int round) {
  const int rounds = gtopk_rounds(ranks);
  if (rank < 0 || rank >= ranks)
    throw invalid_argument("rank", fmt::format("rank {} is outside the group of {} ranks.", rank, ranks), "pass 0 <= rank < ranks.");
  if (round < 0 || round >= rounds)
    throw invalid_argument("round", fmt::format("round {} is outside [0, {}) for {} ranks.", round, rounds, ranks),
                           "pass 0 <= round < ceil(log2 ranks).");
  const std::int64_t half = std::int64_t{1} << round;
  const std::int64_t span = half << 1;
  const std::int64_t r = rank;
  if (r % span == 0) {
    if (r + half < ranks) return {round, tree_role::receive, static_cast<int>(r + half)};
    return {round, tree_role::idle, -1};
  }
  if (r % span == half) return {round, tree_role::send, static_cast<int>(r - half)};
  return {round, tree_role::idle, -1};
}

/// Every round's step for `rank` (size gtopk_rounds(ranks)).
inline std::vector<tree_step> gtopk_schedule(int rank, int ranks) {
  const int rounds = gtopk_rounds(ranks);
  std::vector<tree_step> out;
  out.reserve(static_cast<std::size_t>(rounds));
  for (int j = 0; j < rounds; ++j) out.push_back(gtopk_step(rank, ranks, j));
  return out;
}

// ---- Table I -----------------------------------------------------------------------------------

enum class aggregation : std::uint8_t { dense_allreduce, topk_allreduce, gtopk_allreduce };

/// The time model of one aggregation: latency_terms * alpha + elements * beta.
struct comm_cost {
  double latency_terms = 0;  // coefficient of alpha (messages on the critical path)
  double elements = 0;       // coefficient of beta (elements on the critical path)
  [[nodiscard]] double time(double alpha, double beta) const noexcept { return latency_terms * alpha + elements * beta; }
};

/// gTop-k (Shi et al.) Table I for P ranks, m parameters and k selected per rank.
inline comm_cost table1_cost(aggregation a, int ranks, std::size_t m, std::size_t k) {
  const double lg = static_cast<double>(gtopk_rounds(ranks));
  const double P = ranks;
  switch (a) {
    case aggregation::dense_allreduce: return {2.0 * (P - 1.0), 2.0 * (P - 1.0) / P * static_cast<double>(m)};
    case aggregation::topk_allreduce: return {lg, 2.0 * (P - 1.0) * static_cast<double>(k)};
    case aggregation::gtopk_allreduce: return {2.0 * lg, 4.0 * static_cast<double>(k) * lg};
  }
  return {};
}

/// Table I's beta term in bytes, with values of `value_bytes` and indices of `index_bytes`: the
/// dense term counts m values; a sparse "2k elements" term counts k (index, value) pairs.
/// TopKAllReduce: what each rank receives from the P-1 others; gTopKAllReduce: what rank 0
/// receives over the ceil(log2 P) rounds plus what the broadcast carries, counted once per
/// round as in the paper's flat-tree model.
inline std::size_t table1_bytes(aggregation a, int ranks, std::size_t m, std::size_t k, std::size_t index_bytes, std::size_t value_bytes) {
  const std::size_t lg = static_cast<std::size_t>(gtopk_rounds(ranks));
  const std::size_t P = static_cast<std::size_t>(ranks);
  const std::size_t pair = index_bytes + value_bytes;
  switch (a) {
    case aggregation::dense_allreduce: return 2 * (P - 1) * m * value_bytes / P;
    case aggregation::topk_allreduce: return (P - 1) * k * pair;
    case aggregation::gtopk_allreduce: return 2 * lg * k * pair;
  }
  return 0;
}

}  // namespace gflow::detail::plan
