// build error: gflow::Hybrid<0, g>: the threshold must be positive.
// build errors: 1
// The assert reached through the Exchanger, the way a user meets it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Fusion<1 << 20>, gflow::Topology<gflow::Hybrid<0, 8>>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
