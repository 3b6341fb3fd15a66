#pragma once
// Every gflow policy names its family with a nested `gflow_family` tag; the Exchanger sorts
// its template arguments into families by that tag (exchanger/policy_set.hpp).
namespace gflow {
struct precision_family {};
struct fusion_family {};
struct sparsifier_family {};
struct topology_family {};
struct overlap_family {};
struct sharding_family {};

/// "Nothing", for every family that takes a mode: Sparsifier<None> (every bucket allreduced whole,
/// the dense exchange), Overlap<None> (the exchange runs inside ready() / finish()), Sharding<None>
/// (every rank gets the whole average). Each is also its family's default, so leaving the family
/// out says the same. Fusion takes a size, not a mode: leave it out for one collective per tensor.
struct None {};

template <class P>
concept policy = requires { typename P::gflow_family; };
}  // namespace gflow
