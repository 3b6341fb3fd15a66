// build error: gflow::Overlap<Concurrent<N>>: this sparsifier keeps state across buckets, so its buckets cannot be split over N communicators. Use Overlap<Funneled> (or Chained with Dense).
// build errors: 1
// CSC's selection cursors and buffer cross buckets: its buckets cannot go to N communicators.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

using E = gflow::Exchanger<gflow::Fusion<1024>, gflow::Sparsifier<gflow::CSC<64, 20>>, gflow::Overlap<gflow::Concurrent<2>>>;
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
