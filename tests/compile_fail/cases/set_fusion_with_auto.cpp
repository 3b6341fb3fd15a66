// build error: set_fusion_needs_a_fixed_plan_as_fusion_auto_tunes_its_own
// build errors: 1
// Fusion<Auto>'s buckets are the tuner's: a plan set by hand would be re-tuned away.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

void replans(gflow::Exchanger<gflow::Fusion<gflow::Auto>>::on<gflow::inproc::transport>& ex) { ex.set_fusion(1 << 20); }
