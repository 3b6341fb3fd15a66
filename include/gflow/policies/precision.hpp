#pragma once
// Precision<W>: the element type on the wire. fp32 exchanges the pool as it is; fp16 / bf16
// divide by P (when averaging) and cast with round-to-nearest-even before the collective, so
// the sum cannot overflow where the fp32 sum would not, and cast back after it. Non-finite
// results are counted and reported by Exchanger::finish() (GradientFlow (Sun et al.) section 2.5, Jia et al.
// section 4.1).
#include <concepts>
#include <string_view>
#include <type_traits>

#include "../dtype.hpp"
#include "family.hpp"

namespace gflow {

namespace wire {
struct fp32 { using type = float;    static constexpr std::string_view name = "fp32"; };
struct fp16 { using type = half;     static constexpr std::string_view name = "fp16"; };
struct bf16 { using type = bfloat16; static constexpr std::string_view name = "bf16"; };
}  // namespace wire

template <class W>
concept wire_format = requires {
  typename W::type;
  { W::name } -> std::convertible_to<std::string_view>;
} && wire_element<typename W::type>;

template <class W = wire::fp32>
struct Precision {
  static_assert(wire_format<W>,
                "gflow::Precision<W>: W is not a wire format. "
                "Use gflow::wire::fp32, gflow::wire::fp16 or gflow::wire::bf16.");
  using gflow_family = precision_family;
  // fp32 for a wrong W keeps Precision<not-a-wire-format> down to the one static_assert above.
  using format = std::conditional_t<wire_format<W>, W, wire::fp32>;
  using wire_type = typename format::type;
  static constexpr bool narrow = sizeof(wire_type) < sizeof(float);
};

template <class P>
concept precision_policy = std::same_as<typename P::gflow_family, precision_family> && wire_format<typename P::format>;

static_assert(precision_policy<Precision<>>);
static_assert(precision_policy<Precision<wire::fp16>>);
static_assert(precision_policy<Precision<wire::bf16>>);

}  // namespace gflow
