// build error: gflow::Topology<A>: A is not a topology algorithm. Use gflow::Ring, gflow::Hierarchical<group_size> or gflow::Hybrid<threshold_bytes, group_size>.
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

// A raw type instead of an algorithm, inside a composition: one sentence, not a cascade.
static_assert(sizeof(gflow::Exchanger<gflow::Topology<int>>::on<gflow::mock::transport>) > 0);
