// build error: gflow::OkTopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank selects, e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.
// build errors: 1
#include <gflow/policies/oktopk.hpp>

static_assert(gflow::OkTopK<0.0>::density >= 0);
