// build error: gflow::Exchanger: Sharding<ReduceScatter> needs Sparsifier<None>
// build errors: 1
// A sparse scheme's selection differs per rank and keeps a residual: no rank can own a fixed slice of the sum.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Sharding<gflow::ReduceScatter>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
