// build error: gflow::Exchanger: the transport cannot sum the Precision policy's wire type.
// build errors: 1
// The transport's can_reduce<gflow::half> is false; fp16 on the wire must be refused at compile time.
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

using E = gflow::Exchanger<gflow::Precision<gflow::half>>;
static_assert(sizeof(E::on<gflow_test::fp32_only_transport>) > 0);
