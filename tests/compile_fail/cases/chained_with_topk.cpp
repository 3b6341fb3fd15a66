// build error: gflow::Overlap<Chained>: this sparsifier's exchange does not split into start/complete phases. Use Overlap<Funneled> with it, or Sparsifier<None>.
// build errors: 1
// TopK's exchange (selection, all_gather, apply) is one blocking step.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Overlap<gflow::Chained>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
