// build error: gflow::Fusion<0>: the fusion threshold must be positive.
// build errors: 1
// The same assert reached through the Exchanger, the way a user meets it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<0>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
