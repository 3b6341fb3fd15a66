// build error: gflow::Precision<W>: W is not a wire format.
// build errors: 1
// A likely slip: the element type gflow::half instead of the tag gflow::wire::fp16.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Precision<gflow::half>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
