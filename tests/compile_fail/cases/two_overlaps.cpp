// build error: gflow::Exchanger: more than one Overlap policy. Keep exactly one gflow::Overlap<...>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Overlap<>, gflow::Fusion<1024>, gflow::Overlap<gflow::None>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
