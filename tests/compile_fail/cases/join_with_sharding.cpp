// build error: join_is_not_built_for_sharding_yet
// build errors: 1
// A joined rank still owns a shard that someone must step.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

void joins(gflow::Exchanger<gflow::Sharding<gflow::ReduceScatter>>::on<gflow::inproc::transport>& ex) { (void)ex.join(); }
