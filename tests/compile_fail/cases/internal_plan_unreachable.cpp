// build error: 'gflow::plan' has not been declared
// build errors: 1
// The planners are internal (gflow::detail::plan, include/gflow/detail/plan/): a user's #include <gflow/exchanger.hpp>
// does not make gflow::plan:: reachable (docs/GUIDE.md, "What is public").
#include <gflow/exchanger.hpp>

std::size_t total(const gflow::Layout& l) { return gflow::plan::plan_pool(l).total; }
