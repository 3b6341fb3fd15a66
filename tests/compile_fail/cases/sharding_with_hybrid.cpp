// build error: gflow::Exchanger: Sharding<ReduceScatter> with Topology<Hybrid<t, g>> is not built yet
// build errors: 1
// Hybrid picks ring or hierarchical per message; the two cut a bucket into different shards.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Topology<gflow::Hybrid<(1u << 20), 2>>, gflow::Sharding<gflow::ReduceScatter>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
