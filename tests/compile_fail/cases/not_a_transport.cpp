// build error: T is not a gflow transport
// A type that is not a gflow::transport is refused by a static_assert in the exchanger that says
// which transports exist and where the concept is written down.
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

static_assert(sizeof(gflow::Exchanger<>::on<gflow_test::not_a_transport>) > 0);
