// build error: constraints not satisfied
// A type that is not a gflow::transport is refused by Exchanger<...>::on's constraint, at the
// point of use. (There is no static_assert sentence for this yet: the compiler's own concept
// diagnostic lists which required expression is missing. Both GCC and Clang say "constraints
// not satisfied".)
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

static_assert(sizeof(gflow::Exchanger<>::on<gflow_test::not_a_transport>) > 0);
