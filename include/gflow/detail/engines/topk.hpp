#pragma once
// The Top-k sparsifier engine, detail::topk_engine<Ctx, density, global> (Sparsifier<TopK<d>> and
// Sparsifier<GTopK<d>>): the class and TopK's all_gather exchange (topk/engine.hpp), and GTopK's
// tree exchange (topk/tree.hpp).
#include "archetype.hpp"
#include "concepts.hpp"
#include "topk/engine.hpp"
#include "topk/tree.hpp"

namespace gflow::detail {

// topk_engine meets gflow::detail::sparsifier_engine and counts its collectives, both schemes.
static_assert(sparsifier_engine<topk_engine<archetype_context<>, 0.01, false>, archetype_context<>> &&
                  sparsifier_engine<topk_engine<archetype_context<half>, 0.01, true>, archetype_context<half>> &&
                  counts_collectives<topk_engine<archetype_context<>, 0.01, false>> &&
                  counts_collectives<topk_engine<archetype_context<>, 0.01, true>>,
              "gflow::detail::topk_engine must meet gflow::detail::sparsifier_engine (engines/concepts.hpp)");

}  // namespace gflow::detail
