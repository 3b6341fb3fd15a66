// build error: gflow::CSC<0, ...>: the chunk size must be positive. Pass the number of gradient elements per chunk, e.g. gflow::CSC<32768, 15> (the paper's 32K-element chunks).
// build errors: 1
#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

using E = gflow::Exchanger<gflow::Sparsifier<gflow::CSC<0, 15>>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
