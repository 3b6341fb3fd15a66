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

template <class P>
concept policy = requires { typename P::gflow_family; };
}  // namespace gflow
