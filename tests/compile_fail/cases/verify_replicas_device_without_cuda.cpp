// build error: gflow::verify_replicas: this transport works on device memory, and its values are fingerprinted after a copy to the host.
// build errors: 1
// verify_replicas on an NCCL-style transport (memory_space = device_memory) in a host-only translation unit.
#include <gflow/exchanger.hpp>

#include <span>

#include "fake_transports.hpp"

void check(gflow_test::device_transport& t, std::span<const float> values, const gflow::Layout& layout) { gflow::verify_replicas(t, values, layout); }
