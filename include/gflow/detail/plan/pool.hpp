#pragma once
// Pool planning (pure): where each tensor lives in the one contiguous gradient pool.
// Tensors are placed in generation order, i.e. the reverse of the layout's forward order, so
// the region that backward has finished grows from offset 0 and every bucket is one contiguous
// range (GradientFlow (Sun et al.), section 3.1: tensor-m first, tensor-1 last). A trainer whose backward runs
// in another order (shared or reused tensors, branches) gives the order it observed instead
// (exchange_options::learn_order), so that every bucket is again a contiguous range of tensors
// that become ready together.
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../../error.hpp"
#include "../../layout.hpp"

namespace gflow::detail::plan {

struct pool_plan {
  std::vector<std::size_t> offset;    // offset[i]: first element of tensor i (layout index)
  std::vector<std::size_t> tensor_at; // tensor_at[p]: layout index of the p-th tensor in the pool
  std::size_t total = 0;              // elements in the pool
};

/// The default generation order: the reverse of the layout's forward order.
inline std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  for (std::size_t pos = 0; pos < n; ++pos) order[pos] = n - 1 - pos;
  return order;
}

/// The pool with tensors placed in `order` (order[p]: the layout index at pool position p),
/// which must name every layout index exactly once (invalid_argument otherwise).
inline pool_plan plan_pool(const Layout& layout, std::span<const std::size_t> order) {
  const std::size_t n = layout.size();
  if (order.size() != n)
    throw invalid_argument("order", fmt::format("the generation order names {} tensors; the layout has "
                                        "{}.", order.size(), n),
                           "pass every layout index exactly once, in the order backward produces the gradients.");
  pool_plan p;
  p.offset.assign(n, 0);
  p.tensor_at.resize(n);
  std::vector<bool> seen(n, false);
  std::size_t off = 0;
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = order[pos];
    if (i >= n || seen[i])
      throw invalid_argument("order", fmt::format("position {} of the generation order names tensor {}"
                                          "{}", pos, i, (i >= n ? fmt::format(", past the layout's {} tensors.", n) : ", named before.")),
                             "pass every layout index exactly once, in the order backward produces the gradients.");
    seen[i] = true;
    p.tensor_at[pos] = i;
    p.offset[i] = off;
    off += layout[i].numel;
  }
  p.total = off;
  return p;
}

/// Generation order = reverse forward order (last forward tensor first).
inline pool_plan plan_pool(const Layout& layout) { return plan_pool(layout, reverse_order(layout.size())); }

}  // namespace gflow::detail::plan
