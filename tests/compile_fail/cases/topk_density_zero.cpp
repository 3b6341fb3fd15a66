// build error: gflow::TopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.0>>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
