// build error: gflow::Exchanger: Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> exchange with their own all_gather or merge tree and never use the Topology
// build errors: 1
// GTopK's merge tree talks to the transport directly; Hierarchical would only split it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Fusion<1024>, gflow::Sparsifier<gflow::GTopK<0.01>>, gflow::Topology<gflow::Hierarchical<2>>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
