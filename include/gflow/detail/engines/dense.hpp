#pragma once
// The Dense sparsifier engine (Sparsifier<None>, the default): every bucket is allreduced whole
// through the exchange context (engines/context.hpp: wire cast, topology, average). Its contract
// is gflow::detail::sparsifier_engine (engines/concepts.hpp), asserted below.
#include <cstddef>

#include "archetype.hpp"
#include "concepts.hpp"

namespace gflow::detail {

template <class Ctx>
class dense_engine : public stateless_engine {
 public:
  explicit dense_engine(Ctx& cx) : cx_(&cx) { replan(); }
  void replan() {
    if constexpr (Ctx::narrow) wire_ = typename Ctx::backend::template buffer<typename Ctx::wire_type>(cx_->pool->total);
  }
  void exchange(std::size_t b) {
    const auto& bk = (*cx_->buckets)[b];
    cx_->dense_allreduce(cx_->grads + bk.offset, bk.count, wire_.data() + bk.offset);
  }
  // Phases, for Overlap<Chained>: start bucket b's collective, complete it later.
  static constexpr bool phased = true;
  // No state crosses buckets: Overlap<Concurrent<N>> may give buckets to N engines.
  static constexpr bool independent_buckets = true;
  using request = typename Ctx::request;
  request start(std::size_t b) {
    const auto& bk = (*cx_->buckets)[b];
    return cx_->dense_start(cx_->grads + bk.offset, bk.count, wire_.data() + bk.offset);
  }
  void complete(std::size_t b, request& r) {
    const auto& bk = (*cx_->buckets)[b];
    cx_->dense_complete(cx_->grads + bk.offset, bk.count, wire_.data() + bk.offset, r);
  }
  void end_iteration() {}
  [[nodiscard]] std::size_t wire_bytes() const { return cx_->pool->total * sizeof(typename Ctx::wire_type); }
  // Checkpoints: nothing crosses iterations (stateless_engine's members).

 private:
  Ctx* cx_;
  typename Ctx::backend::template buffer<typename Ctx::wire_type> wire_;
};

// dense_engine meets gflow::detail::sparsifier_engine, on fp32 and 16-bit wires.
static_assert(sparsifier_engine<dense_engine<archetype_context<>>, archetype_context<>> &&
                  sparsifier_engine<dense_engine<archetype_context<half>>, archetype_context<half>>,
              "gflow::detail::dense_engine must meet gflow::detail::sparsifier_engine (engines/concepts.hpp)");
static_assert(phased_engine<dense_engine<archetype_context<>>> && independent_buckets_engine<dense_engine<archetype_context<>>>,
              "gflow::detail::dense_engine runs under every Overlap strategy (Chained, Concurrent<N>)");

}  // namespace gflow::detail
