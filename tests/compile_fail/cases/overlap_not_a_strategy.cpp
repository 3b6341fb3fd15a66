// build error: gflow::Overlap<S>: S is not an overlap strategy. Use gflow::None, gflow::Funneled, gflow::Concurrent<N> or gflow::Chained.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

// A raw type instead of a strategy tag, inside a composition: one sentence, not a cascade from
// the runner that has no such strategy.
static_assert(sizeof(gflow::Exchanger<gflow::Overlap<int>>::on<gflow::mock::transport>) > 0);
