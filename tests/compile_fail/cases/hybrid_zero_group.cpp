// build error: gflow::Hybrid<threshold, 0>: the group size must be positive.
// build errors: 1
#include <gflow/policies/topology.hpp>

static_assert(gflow::Hybrid<(1 << 20), 0>::group_size == 0);
