#pragma once
// The Ok-Topk sparsifier engine, detail::oktopk_engine<Ctx, density, sharded> (Sparsifier<OkTopK<d>>):
// the class, its settings and checkpoint (oktopk/engine.hpp), the local selection and the buffers'
// sizes (oktopk/select.hpp), and the exchange (oktopk/exchange.hpp).
#include "archetype.hpp"
#include "concepts.hpp"
#include "oktopk/engine.hpp"
#include "oktopk/exchange.hpp"
#include "oktopk/select.hpp"

namespace gflow::detail {

static_assert(sparsifier_engine<oktopk_engine<archetype_context<>, 0.01>, archetype_context<>> &&
                  sparsifier_engine<oktopk_engine<archetype_context<half>, 0.01>, archetype_context<half>> &&
                  counts_collectives<oktopk_engine<archetype_context<>, 0.01>>,
              "gflow::detail::oktopk_engine must meet gflow::detail::sparsifier_engine (engines/concepts.hpp)");
static_assert(sparsifier_engine<oktopk_engine<archetype_context<>, 0.01, true>, archetype_context<>> &&
                  sparsifier_engine<oktopk_engine<archetype_context<half>, 0.01, true>, archetype_context<half>>,
              "gflow::detail::oktopk_engine's sharded form must meet gflow::detail::sparsifier_engine (engines/concepts.hpp)");

}  // namespace gflow::detail
