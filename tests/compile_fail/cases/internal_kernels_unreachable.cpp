// build error: 'gflow::kernels' has not been declared
// build errors: 1
// The host kernels are internal (gflow::detail::kernels, include/gflow/detail/kernels/): a user's
// #include <gflow/exchanger.hpp> does not make gflow::kernels:: reachable (docs/GUIDE.md, "What is public").
#include <gflow/exchanger.hpp>

void scale(float* v, std::size_t n) { gflow::kernels::scale_in_place(v, n, 0.5f); }
