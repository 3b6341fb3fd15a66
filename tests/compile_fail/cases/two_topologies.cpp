// build error: gflow::Exchanger: more than one Topology policy. Keep exactly one gflow::Topology<...>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Topology<gflow::Ring>, gflow::Precision<>, gflow::Topology<>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
