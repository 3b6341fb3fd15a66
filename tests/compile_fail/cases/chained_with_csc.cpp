// build error: gflow::Overlap<Chained>: this sparsifier's exchange does not split into start/complete phases. Use Overlap<Funneled> with it, or Sparsifier<None>.
// build errors: 1
// CSC's exchange has no start / complete phases for Chained to interleave.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Fusion<1024>, gflow::Sparsifier<gflow::CSC<64, 20>>, gflow::Overlap<gflow::Chained>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
