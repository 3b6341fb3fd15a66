// build error: gflow::Precision<W>: W is not a wire element type. Use float, gflow::half or gflow::bfloat16.
// build errors: 1
#include <gflow/policies/precision.hpp>

// An element type no transport sums on the wire.
static_assert(sizeof(gflow::Precision<int>) > 0);
