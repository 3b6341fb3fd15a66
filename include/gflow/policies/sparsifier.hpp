#pragma once
// Sparsifier<S>: what part of the pool is exchanged. Dense (the default) exchanges every
// element. The sparse schemes (CSC, TopK, GTopK) are tracked in the issue tracker and will be
// added here as further tags.
#include <concepts>

#include "family.hpp"

namespace gflow {

struct Dense {};

template <class S = Dense>
struct Sparsifier {
  using gflow_family = sparsifier_family;
  using scheme = S;
  static constexpr bool dense = std::same_as<S, Dense>;
};

template <class P>
concept sparsifier_policy = std::same_as<typename P::gflow_family, sparsifier_family> && requires { typename P::scheme; };

static_assert(sparsifier_policy<Sparsifier<>>);

}  // namespace gflow
