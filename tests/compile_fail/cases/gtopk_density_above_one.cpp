// build error: gflow::GTopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.
// build errors: 1
#include <gflow/policies/topk.hpp>

static_assert(gflow::GTopK<1.5>::density > 0);
