// build error: gflow::CSC<..., Percent>: the percent of chunks exchanged per iteration must lie in (0, 100].
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Fusion<1 << 20>, gflow::Sparsifier<gflow::CSC<1024, 150>>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
