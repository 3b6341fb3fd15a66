// build error: gflow::Hierarchical<0>: the group size must be positive. Pass the number of ranks per group (e.g. the GPUs per node), between 1 and the number of ranks.
// build errors: 1
#include <gflow/policies/topology.hpp>

static_assert(gflow::Hierarchical<0>::group_size == 0);
