// build error: join_with_sharding_needs_a_step_for_the_shard_this_rank_still_owns
// build errors: 1
// A joined rank still owns a shard that someone must step: join(after_each) takes the step.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

void joins(gflow::Exchanger<gflow::Sharding<gflow::ReduceScatter>>::on<gflow::inproc::transport>& ex) { (void)ex.join(); }
