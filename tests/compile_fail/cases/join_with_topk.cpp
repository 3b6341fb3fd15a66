// build error: join_needs_a_dense_sparsifier_as_residuals_cannot_be_shadowed
// build errors: 1
// join() shadows the others' iterations with zero contributions; a sparse scheme's residual makes that impossible without losing or sending it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

void joins(gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>>::on<gflow::mock::transport>& ex) { (void)ex.join(); }
