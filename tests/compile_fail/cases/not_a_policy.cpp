// build error: gflow::Exchanger: a template argument is not a gflow policy.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

// int is not a policy; the error must say so, not "no type named precision".
static_assert(sizeof(gflow::Exchanger<int>::on<gflow::mock::transport>) > 0);
