// build error: gflow::Precision<W>: W is not a wire format. Use gflow::wire::fp32, gflow::wire::fp16 or gflow::wire::bf16.
// build errors: 1
#include <gflow/policies/precision.hpp>

// A raw element type instead of a wire tag.
static_assert(sizeof(gflow::Precision<int>) > 0);
