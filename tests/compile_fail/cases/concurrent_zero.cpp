// build error: gflow::Concurrent<N>: N is the number of communicators and must be at least 1.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Fusion<1024>, gflow::Overlap<gflow::Concurrent<0>>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
