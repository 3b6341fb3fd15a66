// build ok
// Positive control: the harness must accept valid code, so a broken harness (wrong include
// path, wrong flags) cannot make every compile-fail case "pass". It also checks that the fake
// transports the other cases use are real transports, so those cases fail for the reason they
// name.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <span>
#include <vector>

#include "fake_transports.hpp"

static_assert(gflow::transport<gflow_test::device_transport>);
static_assert(gflow::transport<gflow_test::fp32_only_transport>);
static_assert(gflow::reduces<gflow_test::fp32_only_transport, float>);
static_assert(!gflow::reduces<gflow_test::fp32_only_transport, gflow::half>);
static_assert(!gflow::transport<gflow_test::not_a_transport>);

using E = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<4 << 20, 1 << 20>, gflow::Topology<>,
                           gflow::Sparsifier<>, gflow::Overlap<>>;
static_assert(sizeof(E::on<gflow::mock::transport>) > 0);
static_assert(sizeof(E::on<gflow::inproc::transport>) > 0);
// Every policy family defaults; any order.
static_assert(sizeof(gflow::Exchanger<>::on<gflow::mock::transport>) > 0);
static_assert(sizeof(gflow::Exchanger<gflow::Fusion<1024>, gflow::Precision<gflow::bfloat16>>::on<gflow::mock::transport>) > 0);
// fp32 on the wire works over a transport that only sums fp32.
static_assert(sizeof(gflow::Exchanger<gflow::Precision<float>>::on<gflow_test::fp32_only_transport>) > 0);
// The compositions the refusing guards must let through, next to the ones they refuse.
static_assert(sizeof(gflow::Exchanger<gflow::Sparsifier<gflow::CSC<64, 20>>, gflow::Topology<gflow::Hybrid<(1 << 20), 2>>>::on<gflow::mock::transport>) > 0);
static_assert(sizeof(gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Topology<gflow::Ring>>::on<gflow::mock::transport>) > 0);
static_assert(sizeof(gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.01>>, gflow::Overlap<gflow::Funneled>>::on<gflow::mock::transport>) > 0);
static_assert(sizeof(gflow::Exchanger<gflow::Fusion<1024>, gflow::Overlap<gflow::Concurrent<2>>>::on<gflow::mock::transport>) > 0);
static_assert(sizeof(gflow::Exchanger<gflow::Fusion<1024>, gflow::Overlap<gflow::Chained>>::on<gflow::mock::transport>) > 0);
// Sharding<ReduceScatter> with what it composes with (Hierarchical, 16-bit wires, Overlap), over the in-process transport.
static_assert(sizeof(gflow::Exchanger<gflow::Sharding<gflow::ReduceScatter>, gflow::Topology<gflow::Hierarchical<2>>, gflow::Precision<gflow::bfloat16>,
                                      gflow::Fusion<1024>, gflow::Overlap<gflow::Chained>>::on<gflow::inproc::transport>) > 0);
// broadcast_parameters / verify_replicas (replicas.hpp, reached from <gflow/exchanger.hpp>) as the API spells them.
inline void replicas(gflow::mock::transport& t, std::vector<float>& v, const gflow::Layout& l) {
  gflow::broadcast_parameters(t, v);
  gflow::broadcast_parameters(t, std::span<float>(v), 0);
  gflow::verify_replicas(t, v, l);
  gflow::verify_replicas(t, std::span<const float>(v), l);
}

int main() {}
