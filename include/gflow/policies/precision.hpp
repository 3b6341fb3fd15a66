#pragma once
// Precision<W>: the element type on the wire. float exchanges the pool as it is; half / bfloat16
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

/// The element types a Precision can put on the wire: float (the default), gflow::half (IEEE
/// fp16) and gflow::bfloat16; wire_name<W> is the short name benchmarks and the Python front end
/// print ("fp32", "fp16", "bf16"). (gflow::dtype::f16 / bf16 are the run-time tags of the same two
/// types, as transports record them: dtype_of_v<half>.)
template <class W> inline constexpr std::string_view wire_name = {};
template <> inline constexpr std::string_view wire_name<float> = "fp32";
template <> inline constexpr std::string_view wire_name<half> = "fp16";
template <> inline constexpr std::string_view wire_name<bfloat16> = "bf16";

template <class W>
concept wire_format = !wire_name<W>.empty();

template <class W = float>
struct Precision {
  static_assert(wire_format<W>,
                "gflow::Precision<W>: W is not a wire element type. "
                "Use float, gflow::half or gflow::bfloat16.");
  using gflow_family = precision_family;
  // float for a wrong W keeps Precision<not-a-wire-type> down to the one static_assert above.
  using wire_type = std::conditional_t<wire_format<W>, W, float>;
  static constexpr bool narrow = sizeof(wire_type) < sizeof(float);
};

template <class P>
concept precision_policy = std::same_as<typename P::gflow_family, precision_family> && wire_format<typename P::wire_type>;

static_assert(precision_policy<Precision<>>);
static_assert(precision_policy<Precision<half>>);
static_assert(precision_policy<Precision<bfloat16>>);

}  // namespace gflow
