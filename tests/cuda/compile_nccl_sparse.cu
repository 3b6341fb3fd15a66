// Compile check (issue 12): the sparse schemes on gflow::nccl::transport with an fp16 wire, every
// member of each exchanger instantiated. Built (not run) wherever nvcc and NCCL are found, so CI
// without a GPU proves the device path compiles; tests/cuda/test_device_sparse.cu runs it.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/transport/nccl.hpp>

namespace gflow_compile {
using T = gflow::nccl::transport;
using fp16 = gflow::Precision<gflow::half>;
using topk_ex = gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>, fp16>::on<T>;
using gtopk_ex = gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.001>>, fp16>::on<T>;
using csc_ex = gflow::Exchanger<gflow::Sparsifier<gflow::CSC<4096, 1>>, fp16>::on<T>;
using gtopk_fused_ex = gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.001>>, fp16, gflow::Fusion<(1 << 20)>>::on<T>;
using oktopk_ex = gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.001>>, fp16, gflow::Fusion<(1 << 20)>>::on<T>;
// The training-loop features on device memory (no_sync, find_unused, learn_order, join): dense.
using dense_ex = gflow::Exchanger<fp16, gflow::Fusion<(1 << 20)>, gflow::Overlap<gflow::Funneled>>::on<T>;
// Sharding<ReduceScatter> over NCCL (ncclReduceScatter / ncclAllGather, or grouped ncclReduce / ncclBroadcast).
using shard_ex = gflow::Exchanger<fp16, gflow::Fusion<(1 << 20)>, gflow::Sharding<gflow::ReduceScatter>>::on<T>;
}  // namespace gflow_compile
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::shard_ex::policies>;
static_assert(gflow::sharding_transport<gflow_compile::T>);
// Every member, join() included (its constraint leaves it out of the sparse instantiations below).
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::dense_ex::policies>;

template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::topk_ex::policies>;
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::gtopk_ex::policies>;
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::csc_ex::policies>;
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::gtopk_fused_ex::policies>;
template class gflow::detail::basic_exchanger<gflow_compile::T, gflow_compile::oktopk_ex::policies>;

// The engines themselves, every member (the exchanger instantiates only what it calls).
namespace gflow_compile {
using ctx = gflow::detail::exchange_context<T, gflow::detail::device_backend, gflow::half, gflow::Ring::engine<T>>;
using ctx32 = gflow::detail::exchange_context<T, gflow::detail::device_backend, float, gflow::Ring::engine<T>>;
}  // namespace gflow_compile
template class gflow::detail::topk_engine<gflow_compile::ctx, 0.01, false>;
template class gflow::detail::topk_engine<gflow_compile::ctx, 0.001, true>;
template class gflow::detail::topk_engine<gflow_compile::ctx32, 0.001, true>;
template class gflow::detail::csc_engine<gflow_compile::ctx, 4096, 1>;
template class gflow::detail::csc_engine<gflow_compile::ctx32, 4096, 1>;
template class gflow::detail::oktopk_engine<gflow_compile::ctx, 0.001>;
template class gflow::detail::oktopk_engine<gflow_compile::ctx32, 0.01>;
template class gflow::detail::oktopk_engine<gflow_compile::ctx, 0.001, true>;  // Sharding<ReduceScatter>
template class gflow::detail::oktopk_engine<gflow_compile::ctx32, 0.01, true>;
static_assert(gflow::detail::sparsifier_engine<gflow::detail::oktopk_engine<gflow_compile::ctx, 0.001>, gflow_compile::ctx>);
static_assert(gflow::detail::sparsifier_engine<gflow::CSC<4096, 1>::engine<gflow_compile::ctx>, gflow_compile::ctx>);
static_assert(gflow::detail::sparsifier_engine<gflow::detail::topk_engine<gflow_compile::ctx, 0.01, false>, gflow_compile::ctx>);
static_assert(gflow::detail::backend_for_transport<gflow::detail::device_backend, gflow_compile::T>);

// broadcast_parameters / verify_replicas on the NCCL transport (device pointers; replicas.hpp,
// cuda/replicas.cuh), instantiated as a trainer would call them.
template void gflow::broadcast_parameters<gflow_compile::T>(gflow_compile::T&, std::span<float>, int);
template void gflow::verify_replicas<gflow_compile::T>(gflow_compile::T&, std::span<const float>, const gflow::Layout&);

// The variable-size collectives of gflow::variable_transport (issue 24: all_to_all, all_to_allv,
// all_gatherv as grouped ncclSend / ncclRecv), every element type the OkTopK engine moves
// (tests/cuda/test_nccl.cu runs them through Sparsifier<OkTopK<d>>).
static_assert(gflow::variable_transport<gflow_compile::T>);
// They and the sharding collectives are members of the transport's base (transport/nccl/grouped.hpp).
using grouped = gflow::nccl::detail::grouped_collectives<gflow_compile::T>;
template void grouped::all_to_all<std::uint64_t>(const std::uint64_t*, std::uint64_t*, std::size_t);
template void grouped::all_to_allv<std::uint8_t>(const std::uint8_t*, const std::size_t*, std::uint8_t*, const std::size_t*);
template void grouped::all_gatherv<std::uint8_t>(const std::uint8_t*, std::size_t, std::uint8_t*, const std::size_t*);
template void grouped::reduce_scatter<gflow::half>(const gflow::half*, gflow::half*, const std::size_t*, gflow::reduce_op);
template void grouped::all_gatherv_in_place<float>(float*, const std::size_t*);
