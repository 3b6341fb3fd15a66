// build error: gflow::Sparsifier<S>: S is not a sparsification scheme. Use gflow::None (dense), gflow::CSC<chunk_elems, percent>, gflow::TopK<density>, gflow::GTopK<density> or gflow::OkTopK<density>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

// A raw type instead of a scheme, inside a composition: one sentence, not a cascade from the
// exchanger asking int for its engine.
static_assert(sizeof(gflow::Exchanger<gflow::Sparsifier<int>>::on<gflow::mock::transport>) > 0);
