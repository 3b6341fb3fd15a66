// build error: gflow::Fusion<Auto, first>: the auto-tuner chooses the first bucket too. Write Fusion<Auto>.
// build errors: 1
#include <gflow/policies/fusion.hpp>

static_assert(sizeof(gflow::Fusion<gflow::Auto, 1024>) > 0);
