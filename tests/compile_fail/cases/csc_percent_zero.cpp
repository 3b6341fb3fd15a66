// build error: gflow::CSC<..., Percent>: the percent of chunks exchanged per iteration must lie in (0, 100]. Pass e.g. gflow::CSC<32768, 15> (100 exchanges every chunk, like gflow::Sparsifier<gflow::None>).
// build errors: 1
#include <gflow/policies/csc.hpp>

static_assert(sizeof(gflow::Sparsifier<gflow::CSC<32768, 0>>) > 0 && gflow::CSC<32768, 0>::percent == 0);
