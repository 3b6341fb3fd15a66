// build error: gflow::Exchanger: this transport works on device memory (NCCL) and needs the CUDA kernels.
// build errors: 1
// TopK on a device-memory transport in a host-only translation unit (no <gflow/cuda/exchanger.cuh>).
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

using E = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>>;
static_assert(sizeof(E::on<gflow_test::device_transport>) > 0);
