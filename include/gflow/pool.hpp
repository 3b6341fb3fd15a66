#pragma once
// The pool: where each tensor's gradient lies in an exchanger's one buffer (docs/DESIGN.md,
// "Semantics"), and how the buckets cut it. Public, for trainers that lay their own buffers out
// like the pool (parameters, optimizer state) and for policies of one's own (cx.pool, cx.buckets).
#include "detail/plan/buckets.hpp"
#include "detail/plan/pool.hpp"
#include "detail/plan/shards.hpp"
#include "layout.hpp"

namespace gflow {

/// The pool's layout (Exchanger::pool_plan(), cx.pool): offset[i] of tensor i (layout index),
/// tensor_at[pos] (the layout index at pool position pos), total elements.
using pool_plan = detail::plan::pool_plan;
/// One fused bucket of the pool (Exchanger::buckets(), cx.buckets): first_pos, end_pos (pool
/// positions), offset, count (pool elements).
using bucket = detail::plan::bucket;
/// A range of pool elements [begin, end), size(): a shard of one bucket (Exchanger::shard(),
/// Sharding<ReduceScatter>).
using pool_range = detail::plan::pool_range;

/// The pool of `layout` before an exchanger exists: the default generation order (last tensor
/// first), as Exchanger::pool_plan() has it until learn_order or a checkpoint re-lays it out.
inline pool_plan plan_pool(const Layout& layout) { return detail::plan::plan_pool(layout); }

}  // namespace gflow
