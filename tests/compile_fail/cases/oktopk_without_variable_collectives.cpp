// build error: gflow::Sparsifier<OkTopK<d>> needs a transport with all_to_all, all_to_allv and all_gatherv (gflow::variable_transport, include/gflow/transport/transport.hpp).
// build errors: 1
// A host transport that meets gflow::transport but has no variable-size collectives: OkTopK's engine refuses it.
#include <gflow/exchanger.hpp>

#include "fake_transports.hpp"

using T = gflow_test::fp32_only_transport;
using Ctx = gflow::detail::exchange_context<T, gflow::detail::host_backend, float, gflow::Ring::engine<T>>;
static_assert(sizeof(gflow::detail::oktopk_engine<Ctx, 0.01>) > 0);
