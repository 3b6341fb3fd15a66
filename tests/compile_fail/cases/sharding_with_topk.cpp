// build error: gflow::Exchanger: Sharding<ReduceScatter> needs Sparsifier<None>
// build errors: 1
// TopK and GTopK send every selection to every rank, CSC allreduces whole chunks: none hands a rank only its slice.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Sharding<gflow::ReduceScatter>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
