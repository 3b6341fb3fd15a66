// build error: gflow::Exchanger: more than one Fusion policy. Keep exactly one gflow::Fusion<...>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Fusion<1 << 20>, gflow::Fusion<25 << 20>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
