// build error: gflow::Exchanger: Sharding<ReduceScatter> needs a transport with reduce_scatter
// build errors: 1
// A transport of the user's without the members of gflow::sharding_transport.
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

using host_fake = gflow_test::fake_transport<gflow::host_memory, gflow_test::reduces_everything>;
using E = gflow::Exchanger<gflow::Sharding<gflow::ReduceScatter>>;
static_assert(sizeof(E::on<host_fake>) > 0);
