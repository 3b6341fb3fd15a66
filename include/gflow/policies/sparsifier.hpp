#pragma once
// Sparsifier<S>: what part of the pool is exchanged, and what is kept back as residual.
//
// A scheme S provides an engine, built once per exchanger over its exchange context
// (detail/exchange_context.hpp); the contract is the concept gflow::detail::sparsifier_engine
// (detail/concepts.hpp), asserted after each engine:
//
//   template <class Ctx> class engine {
//     explicit engine(Ctx& cx);       // after planning; may allocate here
//     void replan();                  // the buckets changed (Exchanger::set_fusion)
//     void exchange(std::size_t b);   // bucket b's gradients are final: exchange them in place
//     void end_iteration();           // after the last bucket (selection for the next iteration)
//     std::size_t wire_bytes() const; // bytes this rank handed to collectives this iteration
//     // checkpoints (Exchanger::save_state / load_state, between iterations):
//     void save_state(detail::checkpoint_writer&) const;
//     saved_state read_state(detail::checkpoint_reader&) const;  // reads and validates, changes nothing
//     void restore_state(saved_state&&);                         // applies it
//   };
//
// exchange() runs in pool order, once per bucket per iteration, on every rank in the same order,
// on the caller's thread or on the Overlap policy's issuing thread. An engine that can split a
// bucket's exchange into phases (needed by Overlap<Chained>) also has
//     static constexpr bool phased = true;  request start(b);  void complete(b, request&);
// Dense (the default) allreduces every bucket. The sparse schemes live in csc.hpp (CSC) and
// topk.hpp (TopK, GTopK), which include this header; detail/policy_set.hpp includes all three.
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "../detail/archetype_context.hpp"
#include "../detail/concepts.hpp"
#include "family.hpp"

namespace gflow {

struct Dense {
  template <class Ctx>
  class engine {
   public:
    explicit engine(Ctx& cx) : cx_(&cx) { replan(); }
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
    // Checkpoints: Dense keeps nothing across iterations.
    struct saved_state {};
    template <class Writer>
    void save_state(Writer&) const {}
    template <class Reader>
    [[nodiscard]] saved_state read_state(Reader&) const { return {}; }
    void restore_state(saved_state&&) noexcept {}

   private:
    Ctx* cx_;
    typename Ctx::backend::template buffer<typename Ctx::wire_type> wire_;
  };
};

// Dense's engine meets gflow::detail::sparsifier_engine (detail/concepts.hpp), on fp32 and 16-bit wires.
static_assert(detail::sparsifier_engine<Dense::engine<detail::archetype_context<>>, detail::archetype_context<>> &&
                  detail::sparsifier_engine<Dense::engine<detail::archetype_context<half>>, detail::archetype_context<half>>,
              "gflow::Dense::engine must meet gflow::detail::sparsifier_engine");

/// A sparsification scheme: a class whose member template engine<Ctx> is the engine over an
/// exchange context (Dense, CSC<chunk, percent>, TopK<d>, GTopK<d>, or one's own; the engine's
/// contract is detail::sparsifier_engine).
template <class S>
concept sparsifier_scheme = requires { typename S::template engine<detail::archetype_context<>>; };

template <class S = Dense>
struct Sparsifier {
  static_assert(sparsifier_scheme<S>,
                "gflow::Sparsifier<S>: S is not a sparsification scheme. "
                "Use gflow::Dense, gflow::CSC<chunk_elems, percent>, gflow::TopK<density> or gflow::GTopK<density>.");
  using gflow_family = sparsifier_family;
  // Dense for a wrong S keeps Sparsifier<not-a-scheme> down to the one static_assert above.
  using scheme = std::conditional_t<sparsifier_scheme<S>, S, Dense>;
  static constexpr bool dense = std::same_as<S, Dense>;
};

template <class P>
concept sparsifier_policy = std::same_as<typename P::gflow_family, sparsifier_family> && requires { typename P::scheme; };

static_assert(sparsifier_policy<Sparsifier<>>);

}  // namespace gflow
