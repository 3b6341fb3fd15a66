#pragma once
// Bucket planning (pure): how the pool is cut into fused allreduce messages.
// Walk the pool in generation order, adding whole tensors to the open bucket, and close it as
// soon as it holds at least `cap` bytes on the wire (lazy allreduce, GradientFlow (Sun et al.) section 3.1).
// The first bucket may use a smaller cap (PyTorch DDP: 1 MiB, then 25 MiB) so communication
// starts early. The plan depends only on the layout and the numbers, never on the order
// ready() is called in, so every rank issues the same collectives in the same order.
#include <cstddef>
#include <vector>

#include "../../error.hpp"
#include "pool.hpp"

namespace gflow::detail::plan {

struct bucket {
  std::size_t first_pos = 0;  // first pool position (tensor) in the bucket
  std::size_t end_pos = 0;    // one past the last pool position
  std::size_t offset = 0;     // first pool element
  std::size_t count = 0;      // elements
};

struct bucket_params {
  std::size_t wire_bytes_per_element = 4;
  std::size_t threshold_bytes = 0;     // 0: no fusion, one bucket per tensor
  std::size_t first_bucket_bytes = 0;  // 0: the first bucket uses threshold_bytes too
};

inline std::vector<bucket> plan_buckets(const Layout& layout, const pool_plan& pool, const bucket_params& prm) {
  if (prm.wire_bytes_per_element == 0)
    throw invalid_argument("wire_bytes_per_element", "must be positive.", "pass the size of the wire type.");
  std::vector<bucket> out;
  const std::size_t n = pool.tensor_at.size();
  bucket cur{};
  std::size_t cur_bytes = 0;
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t numel = layout[pool.tensor_at[pos]].numel;
    if (cur.count == 0) {
      cur.first_pos = pos;
      cur.offset = pool.offset[pool.tensor_at[pos]];
    }
    cur.count += numel;
    cur.end_pos = pos + 1;
    cur_bytes += numel * prm.wire_bytes_per_element;
    const std::size_t cap = (out.empty() && prm.first_bucket_bytes != 0) ? prm.first_bucket_bytes : prm.threshold_bytes;
    if (cur_bytes >= cap) {  // cap 0 closes after every tensor
      out.push_back(cur);
      cur = bucket{};
      cur_bytes = 0;
    }
  }
  if (cur.count != 0) out.push_back(cur);
  return out;
}

}  // namespace gflow::detail::plan
