// build error: gflow::Fusion<0>: the fusion threshold must be positive. To exchange one collective per tensor, leave Fusion out of the Exchanger.
// build errors: 1
#include <gflow/policies/fusion.hpp>

static_assert(sizeof(gflow::Fusion<0>) > 0);
