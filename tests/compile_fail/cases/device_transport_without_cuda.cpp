// build error: gflow::Exchanger: this transport works on device memory (NCCL) and needs the CUDA kernels.
// build errors: 1
// An NCCL-style transport (memory_space = device_memory) in a host-only translation unit.
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

using E = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>>;
static_assert(sizeof(E::on<gflow_test::device_transport>) > 0);
