#pragma once
// Pool planning (pure): where each tensor lives in the one contiguous gradient pool.
// Tensors are placed in generation order, i.e. the reverse of the layout's forward order, so
// the region that backward has finished grows from offset 0 and every bucket is one contiguous
// range (paper 000, section 3.1: tensor-m first, tensor-1 last).
#include <cstddef>
#include <vector>

#include "../layout.hpp"

namespace gflow::plan {

struct pool_plan {
  std::vector<std::size_t> offset;    // offset[i]: first element of tensor i (layout index)
  std::vector<std::size_t> tensor_at; // tensor_at[p]: layout index of the p-th tensor in the pool
  std::size_t total = 0;              // elements in the pool
};

inline pool_plan plan_pool(const Layout& layout) {
  const std::size_t n = layout.size();
  pool_plan p;
  p.offset.resize(n);
  p.tensor_at.resize(n);
  std::size_t off = 0;
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = n - 1 - pos;  // generation order: last forward tensor first
    p.tensor_at[pos] = i;
    p.offset[i] = off;
    off += layout[i].numel;
  }
  p.total = off;
  return p;
}

}  // namespace gflow::plan
