#pragma once
// Group planning (pure): which ranks form which group for the hierarchical allreduce
// (Jia et al. section 4.3: reduce inside each group to its master, allreduce among the masters,
// broadcast inside each group).
//
// The rule, for P ranks and a group size g with 1 <= g <= P:
//   - Groups are consecutive blocks of ranks: group k holds ranks [k*g, min((k+1)*g, P)).
//     There are G = ceil(P / g) groups. When g does not divide P, the LAST group is smaller:
//     it holds the P - (G-1)*g remaining ranks (possibly a single rank). Every other group has
//     exactly g ranks. (Consecutive blocks match how launchers number ranks: the g ranks of a
//     node are consecutive, and a partly filled last node is the smaller group.)
//   - The master of group k is its lowest rank, k*g.
//   - Order inside a group: by rank, so the master is rank 0 of its group and rank r has local
//     rank r - k*g. Order among the masters: by group index, so group k's master is rank k of
//     the masters' group.
//   - Split arguments (transport.split(color, key), called by every rank, twice, in this order):
//       group split:   color = k (the group index),              key = rank
//       masters split: color = G for masters, G + 1 for the rest, key = rank
//     Non-masters take part in the masters' split too (a split is collective over the whole
//     transport) and land in a spare group of their own that is never used. The colours of the
//     two splits do not overlap (0..G-1, then G and G+1), so a sub-group's label in the mock
//     transport's log ("world/<color>") names it unambiguously.
// Errors: P < 1, g < 1 or g > P raise gflow::invalid_argument naming the parameter and the fix.
#include <string>
#include <vector>

#include "../../error.hpp"

namespace gflow::detail::plan {

/// Arguments of one transport.split(color, key) call.
struct split_args {
  int color = 0;
  int key = 0;
  friend bool operator==(const split_args&, const split_args&) = default;
};

struct group_plan {
  int ranks = 1;       // P
  int group_size = 1;  // g: ranks per group (the last group may hold fewer)
  int groups = 1;      // G = ceil(P / g)

  /// The group rank r belongs to.
  [[nodiscard]] int group_of(int rank) const { return check_rank(rank) / group_size; }
  /// Number of ranks in group k (g, except the last group when g does not divide P).
  [[nodiscard]] int size_of(int group) const {
    check_group(group);
    return group + 1 < groups ? group_size : ranks - (groups - 1) * group_size;
  }
  /// Group k's master: its lowest rank.
  [[nodiscard]] int master(int group) const { return check_group(group) * group_size; }
  /// Rank r's position inside its group (0 for the master).
  [[nodiscard]] int local_rank(int rank) const { return check_rank(rank) % group_size; }
  [[nodiscard]] bool is_master(int rank) const { return local_rank(rank) == 0; }
  /// The ranks of group k, in group order.
  [[nodiscard]] std::vector<int> members(int group) const {
    std::vector<int> out;
    const int first = master(group);
    for (int i = 0; i < size_of(group); ++i) out.push_back(first + i);
    return out;
  }
  /// The masters, in masters'-group order (group 0's master first).
  [[nodiscard]] std::vector<int> masters() const {
    std::vector<int> out;
    for (int k = 0; k < groups; ++k) out.push_back(master(k));
    return out;
  }
  /// Rank r's arguments for the first split (its group).
  [[nodiscard]] split_args group_split(int rank) const { return {group_of(rank), rank}; }
  /// Rank r's arguments for the second split (masters together; the others in a spare group).
  [[nodiscard]] split_args masters_split(int rank) const { return {is_master(rank) ? groups : groups + 1, rank}; }
  /// Rank r's arguments for the peers' split (Sharding over groups): the ranks with r's local rank,
  /// one per group, in group order.
  [[nodiscard]] split_args peers_split(int rank) const { return {local_rank(rank), group_of(rank)}; }

 private:
  int check_rank(int rank) const {
    if (rank < 0 || rank >= ranks)
      throw invalid_argument("rank", fmt::format("rank {} is outside the {} ranks of the group plan.", rank, ranks),
                             fmt::format("pass a rank in [0, {}).", ranks));
    return rank;
  }
  int check_group(int group) const {
    if (group < 0 || group >= groups)
      throw invalid_argument("group", fmt::format("group {} does not exist; the plan has {} groups.", group, groups),
                             fmt::format("pass a group index in [0, {}).", groups));
    return group;
  }
};

/// The groups of `group_size` ranks out of `ranks` (see the rule above).
inline group_plan plan_groups(int ranks, int group_size) {
  if (ranks < 1)
    throw invalid_argument("ranks", fmt::format("a group plan needs at least one rank (got {}).", ranks),
                           "pass the transport's size(), which is at least 1.");
  if (group_size < 1)
    throw invalid_argument("group_size",
                           fmt::format("the hierarchical group size must be positive (got {}).", group_size),
                           fmt::format("pass the number of ranks per group, e.g. the GPUs per node, between 1 and the number of ranks ("
                               "{}).", ranks));
  if (group_size > ranks)
    throw invalid_argument("group_size",
                           fmt::format("the hierarchical group size {} exceeds the {}"
                               " ranks of the transport.", group_size, ranks),
                           fmt::format("pass a group size between 1 and {}"
                               " (e.g. the ranks per node), or use Topology<Ring> on this few ranks.", ranks));
  return {ranks, group_size, (ranks + group_size - 1) / group_size};
}

}  // namespace gflow::detail::plan
