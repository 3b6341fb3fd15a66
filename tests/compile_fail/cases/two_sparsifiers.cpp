// build error: gflow::Exchanger: more than one Sparsifier policy. Keep exactly one gflow::Sparsifier<...>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<>, gflow::Sparsifier<gflow::None>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
