// build error: gflow::Exchanger: Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> exchange with their own all_gather or merge tree and never use the Topology
// build errors: 1
// Before this guard the composition compiled and split the communicator twice for an engine never used.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Topology<gflow::Hybrid<(1 << 20), 2>>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
