// build error: gflow::Exchanger: more than one Precision policy. Keep exactly one gflow::Precision<...>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>, gflow::Precision<gflow::bfloat16>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
