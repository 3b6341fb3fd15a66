#pragma once
// gflow::Exchanger<Policies...>: the facade a trainer includes.
//
//   using Exchange = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   // each iteration, during backward:
//   write_gradient(ex.view(i)); ex.ready(i);        // in any order
//   auto status = ex.finish();                       // averaged gradients now in the views
//   if (!status.finite()) skip_step();
//
// Policies may come in any order; missing families take defaults (fp32 wire, no fusion, dense,
// ring, no overlap). The exchange plan (pool offsets, buckets) is computed once from the layout;
// an iteration allocates nothing and makes no virtual call.
//
// Training loops (docs/DESIGN.md): no_sync() accumulates micro-batches; exchange_options::find_unused
// exchanges unmarked tensors as zeros, learn_order lays the pool out in rank 0's ready() order, and
// uneven_inputs lets a rank out of data join() (shadow the others' iterations with zeros).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "extension.hpp"
#include "pool.hpp"
#include "detail/support/checkpoint.hpp"
#include "detail/exchanger/consistency.hpp"
#include "options.hpp"
#include "detail/engines/context.hpp"
#include "detail/engines/host_backend.hpp"
#include "detail/engines/sharded.hpp"
#include "detail/exchanger/runners.hpp"
#include "detail/exchanger/iteration.hpp"
#include "detail/exchanger/training_loop.hpp"
#include "detail/exchanger/state_io.hpp"
#include "detail/exchanger/sharding.hpp"
#include "detail/exchanger/policy_set.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "detail/plan/buckets.hpp"
#include "detail/plan/pool.hpp"
#include "replicas.hpp"
#include "timeline.hpp"
#include "detail/exchanger/tuning.hpp"
#include "transport/transport.hpp"

namespace gflow {

/// The fusion auto-tuner of a Fusion<Auto> composition, as Exchanger::tuner() shows it: phase(),
/// the fitted alpha-beta, retunes() (docs/GUIDE.md, "Fusion<Auto>").
using fusion_tuner = detail::fusion_tuner;
/// The scope ex.no_sync() returns (gradient accumulation): move-only; scopes nest.
using no_sync_scope = detail::no_sync_scope;

namespace detail {

// The exchanger object; users spell it Exchanger<Policies...>::on<T> (below).
template <class T, class Set>
class basic_exchanger : private detail::iteration_state {
  static_assert(transport<T>,
                "gflow::Exchanger<...>::on<T>: T is not a gflow transport. Use gflow::mpi::transport, "
                "gflow::nccl::transport, gflow::inproc::transport or gflow::mock::transport, or give T every member "
                "the gflow::transport concept lists (include/gflow/transport/transport.hpp).");
  static_assert(detail::has_backend<typename T::memory_space>,
                "gflow::Exchanger: this transport works on device memory (NCCL) and needs the CUDA kernels. "
                "Compile the translation unit with nvcc (a .cu file) and include <gflow/cuda/exchanger.cuh>.");
  using precision = typename Set::precision;
  using wire_t = typename precision::wire_type;
  static_assert(reduces<T, wire_t>,
                "gflow::Exchanger: the transport cannot sum the Precision policy's wire type. "
                "Pick a wire format the transport reduces (every gflow transport reduces float) or another transport.");
  using backend = typename detail::backend_or_host<typename T::memory_space>::type;
  using engine_t = typename Set::topology::algorithm::template engine<T>;
  using context_t = detail::exchange_context<T, backend, wire_t, engine_t>;
  static constexpr bool sharded = Set::sharding::sharded;
  static_assert(detail::sharding_checks<T, sharded>::ok);
  using sparsifier_t = typename detail::engine_of<typename Set::sparsifier::scheme, context_t, sharded>::type;
  using runner_t = detail::runner_for<typename Set::overlap::strategy, context_t, sparsifier_t>;
  // The built-in engines are asserted where they are defined; these fire for one's own.
  static_assert(detail::backend_for_transport<backend, T>,
                "gflow::Exchanger: this memory space has no complete set of gflow's kernels. Use a transport over "
                "gflow::host_memory or gflow::device_memory (the latter from a .cu file that includes <gflow/cuda/exchanger.cuh>).");
  static_assert(detail::topology_engine<engine_t, T, wire_t>,
                "gflow::Exchanger: Topology<A>::engine<T> is not a topology engine. Give it what gflow::topology_engine "
                "lists (<gflow/extension.hpp>, docs/GUIDE.md): a constructor from T&, run / start for float and the wire type, wait(request&).");
  static_assert(detail::sparsifier_engine<sparsifier_t, context_t>,
                "gflow::Exchanger: Sparsifier<S>::engine<Ctx> is not a sparsifier engine. Give it what gflow::sparsifier_engine "
                "lists (<gflow/extension.hpp>, docs/GUIDE.md): a constructor from Ctx&, replan, exchange(b), end_iteration, wire_bytes, "
                "save_state / read_state / restore_state.");

 public:
  /// Fusion<Auto>: the buckets are the auto-tuner's (tuner()), and set_fusion is not offered.
  static constexpr bool autotuned = requires { requires Set::fusion::autotuned; };
  using transport_type = T;
  using policies = Set;
  using wire_type = wire_t;

  basic_exchanger(T& t, Layout layout, exchange_options opt = {})
      : detail::iteration_state(layout.size(), t.size(), opt.learn_order), t_(&t), layout_(verified(t, std::move(layout), opt)), opt_(opt), pool_(detail::plan::plan_pool(layout_)),
        grads_(pool_.total), kernels_(t), engine_(t) {
    plan(Set::fusion::threshold_bytes, Set::fusion::first_bucket_bytes);
    cx_ = context_t{t_, &engine_, &kernels_, &layout_, &pool_, &buckets_, grads_.data(), opt_.average, &iteration_, &threshold_, &trace_, &contributors_,
                    sharded ? &shards_ : nullptr};
    sparsifier_.emplace(cx_);
    runner_.emplace(cx_, *sparsifier_);
    if constexpr (autotuned) detail::tuning::start(*this);
  }

  basic_exchanger(const basic_exchanger&) = delete;
  basic_exchanger& operator=(const basic_exchanger&) = delete;

  // ---- the pool ----------------------------------------------------------------------------
  /// Tensor i's gradient (layout index, forward order): write it here, then call ready(i).
  [[nodiscard]] std::span<float> view(std::size_t i) {
    check_index(i, "view");
    return {grads_.data() + pool_.offset[i], layout_[i].numel};
  }
  [[nodiscard]] float* pool_data() noexcept { return grads_.data(); }
  [[nodiscard]] std::size_t pool_size() const noexcept { return pool_.total; }

  // ---- one iteration -----------------------------------------------------------------------
  /// Tensor i's gradient is complete in its view. Any order; exactly once per iteration.
  /// Inside a no_sync() scope it only notes that the view holds accumulated gradient.
  void ready(std::size_t i) {
    check_index(i, "ready");
    if (no_sync_depth_ > 0) {
      held_[i] = 1;
      accumulated_ = true;
      return;
    }
    if (ready_[i]) throw detail::double_ready_error(layout_, i, iteration_);
    if (ready_count_ == 0) detail::training_loop::begin_iteration(*this);
    mark(i, by_trainer);
  }

  /// Copying path for a gradient that lives elsewhere (same memory space as the transport).
  void ready(std::size_t i, std::span<const float> source) {
    check_index(i, "ready");
    if (source.size() != layout_[i].numel)
      throw invalid_argument("source", fmt::format("ready({}, source) got {}"
                                           " elements; tensor {} ('{}') has "
                                           "{}.", i, source.size(), i, layout_[i].name, layout_[i].numel),
                             "pass a span of exactly the tensor's element count.");
    if (ready_[i] && no_sync_depth_ == 0) ready(i);  // reports the double ready before anything is overwritten
    kernels_.order_after_producer();  // device: the copy waits for the producer stream
    float* dst = grads_.data() + pool_.offset[i];
    if (held_[i]) kernels_.add(dst, source.data(), source.size());  // accumulation (no_sync): adds to what the view holds
    else kernels_.copy(dst, source.data(), source.size());
    ready(i);
  }

  /// Completes the iteration; the averaged (or summed) gradients are then in the views,
  /// identical on every rank. Check status.finite() before applying them.
  [[nodiscard]] exchange_status finish() {
    if (no_sync_depth_ > 0) throw detail::finish_in_no_sync_error();
    const std::int64_t finish_begin = trace_ ? timeline::now_ns() : 0;
    if (ready_count_ != layout_.size()) detail::training_loop::complete_missing(*this);
    try {
      if (learning_) detail::training_loop::learn_order(*this);
      runner_->drain();  // every bucket exchanged (issuing threads), or their first error
      if (opt_.find_unused) detail::training_loop::gather_unused(*this);
    } catch (...) {
      next_iteration();
      throw;
    }
    sparsifier_->end_iteration();
    exchange_status st;
    st.iteration = iteration_;
    st.nonfinite = kernels_.take_nonfinite() + runner_->take_nonfinite();
    if constexpr (sharded) st.nonfinite = detail::sharding_steps::agreed_nonfinite(*this, st.nonfinite);  // each rank saw its shard only
    if constexpr (detail::counts_collectives<sparsifier_t>)
      st.collectives = sparsifier_->collectives();  // the scheme's own count (norms, gathers, tree rounds)
    else
      st.collectives = buckets_.size();
    st.wire_bytes = sparsifier_->wire_bytes();
    st.contributors = contributors_;
    if (!unused_.empty()) st.unused = unused_;
    if (trace_) [[unlikely]] trace_finish(finish_begin);
    next_iteration();
    if constexpr (autotuned) detail::tuning::step(*this);
    return st;
  }

  // ---- training loops (docs/DESIGN.md, "Training loops") --------------------------------------
  /// Gradient accumulation: while the no_sync_scope lives, ready() exchanges and sends nothing and
  /// the views keep what backward writes or adds into them (ready(i, source) adds). The first
  /// iteration after the scope exchanges the accumulated sum as usual. Scopes nest.
  [[nodiscard]] no_sync_scope no_sync() {
    if (ready_count_ != 0 && no_sync_depth_ == 0) throw detail::mid_iteration_error("no_sync", ready_count_, layout_.size(), iteration_);
    return no_sync_scope(no_sync_depth_);
  }

  // join()'s constraints: their names are what the compiler prints when a call does not fit.
  static constexpr bool join_needs_a_dense_sparsifier_as_residuals_cannot_be_shadowed = Set::sparsifier::dense;
  static constexpr bool join_with_sharding_needs_a_step_for_the_shard_this_rank_still_owns = !sharded;
  /// Uneven inputs (exchange_options::uneven_inputs): a rank out of data calls join(); it shadows
  /// the others' iterations with zeros (they average over the ranks that contributed) until every
  /// rank has called it. Sparsifier<None> only: a sparse scheme keeps a residual per rank, which
  /// a joined rank could neither send nor drop (the constraint names why when it fails).
  join_status join()
    requires join_needs_a_dense_sparsifier_as_residuals_cannot_be_shadowed && join_with_sharding_needs_a_step_for_the_shard_this_rank_still_owns
  {
    return detail::training_loop::join(*this, [](const exchange_status&) {});
  }
  /// join() that calls after_each(status) after each shadowed iteration's finish(), between
  /// iterations, as the training ranks step. With Sharding this rank still owns a shard: step it
  /// there and call gather_shards, as the training ranks do after their finish().
  template <std::invocable<const exchange_status&> F>
    requires join_needs_a_dense_sparsifier_as_residuals_cannot_be_shadowed
  join_status join(F&& after_each) {
    return detail::training_loop::join(*this, after_each);
  }

  /// Counts the re-layouts of the pool (learn_order, load_state): views obtained before a change
  /// of generation() point at other tensors' gradients; take them again.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

  // ---- sharding (Sharding<ReduceScatter>; docs/GUIDE.md, "Sharding") --------------------------
  /// This rank's shard: one range of pool elements per bucket (its block of each, empty where a
  /// bucket has fewer elements than ways). The shards of the ranks a bucket is split among are
  /// disjoint and cover it once. After finish() the pool holds the average inside them; outside,
  /// its values are unspecified. It changes only when the buckets or their split are re-planned
  /// (Fusion<Auto>'s tuner, set_fusion(), learn_order, load_state, Hybrid's threshold):
  /// shard_generation() counts the changes, and move_shard_state follows them.
  [[nodiscard]] std::span<const pool_range> shard() const noexcept requires sharded { return shards_.mine; }
  [[nodiscard]] std::uint64_t shard_generation() const noexcept requires sharded { return shard_log_.generation; }
  /// Per-element state a trainer keeps for its shard (`state` packs shard()'s ranges of generation
  /// `from` back to back, e.g. momentum), moved to the current shard: collective, between iterations.
  /// `state` is host memory on every transport (on device memory it is staged through the device).
  [[nodiscard]] std::vector<float> move_shard_state(std::span<const float> state, std::uint64_t from)
    requires sharded && variable_transport<T>
  {
    between_iterations("move_shard_state");
    return detail::sharding_steps::move_state(*this, state, from);
  }
  /// In place over `values` (laid out like the pool, pool_size() elements): this rank's shard of
  /// it goes to every rank and every other rank's shard comes back (an all-gather per bucket), e.g.
  /// the parameters after each rank stepped its shard. Through the Precision's wire type: with a
  /// 16-bit wire every value, this rank's own too, is rounded to it. With Hierarchical<g> the
  /// gather runs inside each group (every group holds the same shards). Between iterations only;
  /// collective (every rank, the same number of calls).
  void gather_shards(std::span<float> values)
    requires sharded
  {
    between_iterations("gather_shards");
    detail::sharding_steps::check_gather(values.size(), pool_.total);
    sparsifier_->gather(values.data());
  }

  // ---- tuning and introspection ------------------------------------------------------------
  static constexpr bool set_fusion_needs_a_fixed_plan_as_fusion_auto_tunes_its_own = !autotuned;
  /// Re-plans the buckets as Fusion<threshold_bytes, first_bucket_bytes> would (for a sweep or a
  /// tuner of one's own). Between iterations; collective, the same numbers on every rank (checked
  /// unless exchange_options::verify is false: a difference is a mismatch_error on every rank).
  void set_fusion(std::size_t threshold_bytes, std::size_t first_bucket_bytes = 0)
    requires set_fusion_needs_a_fixed_plan_as_fusion_auto_tunes_its_own
  {
    if (ready_count_ != 0) throw detail::set_fusion_mid_iteration_error(iteration_);
    if (threshold_bytes == 0) throw detail::fusion_threshold_zero_error();
    if (opt_.verify) detail::verify_fusion(*t_, threshold_bytes, first_bucket_bytes);
    replan_fusion(threshold_bytes, first_bucket_bytes);
  }

  [[nodiscard]] const Layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const gflow::pool_plan& pool_plan() const noexcept { return pool_; }
  [[nodiscard]] const std::vector<bucket>& buckets() const noexcept { return buckets_; }
  [[nodiscard]] std::size_t threshold_bytes() const noexcept { return threshold_; }
  [[nodiscard]] std::size_t first_bucket_bytes() const noexcept { return first_bucket_; }
  [[nodiscard]] std::uint64_t iteration() const noexcept { return iteration_; }
  [[nodiscard]] const exchange_options& options() const noexcept { return opt_; }
  [[nodiscard]] T& transport() const noexcept { return *t_; }
  /// Device transports: the stream the backward pass writes gradients on. Each bucket's work is
  /// then ordered after it by an event, with no host synchronisation in ready().
  template <class Stream>
    requires detail::accepts_producer<typename backend::context, Stream>
  void set_producer_stream(Stream s) {
    kernels_.set_producer(s);
  }
  /// The topology's engine (e.g. Hybrid's set_threshold for an auto-tuner; between iterations).
  [[nodiscard]] engine_t& topology() noexcept { return engine_; }
  /// The sparsifier's engine: residuals, selections (e.g. the chunks CSC exchanged this iteration).
  [[nodiscard]] sparsifier_t& sparsifier() noexcept { return *sparsifier_; }
  [[nodiscard]] const sparsifier_t& sparsifier() const noexcept { return *sparsifier_; }

  // ---- timeline (gflow/timeline.hpp) -------------------------------------------------------------
  /// Records this exchanger's events into `tl` (null: off, the default). Between iterations; `tl`
  /// must outlive the exchanger or be detached first.
  void set_timeline(timeline* tl) {
    between_iterations("set_timeline");
    if constexpr (autotuned) {
      tuned_mark_ = tl ? tl->size() : 0;
      trace_ = tl ? tl : own_timeline_.get();  // Fusion<Auto> measures through a timeline of its own otherwise
    } else {
      trace_ = tl;
    }
  }
  [[nodiscard]] timeline* attached_timeline() const noexcept {
    if constexpr (autotuned) return trace_ == own_timeline_.get() ? nullptr : trace_;
    else return trace_;
  }

  // ---- auto-tuner (Fusion<Auto>, gflow/detail/exchanger/tuner.hpp) --------------------------------------------------
  /// The tuner (Fusion<Auto> only): its phase, fitted alpha-beta and retune count.
  [[nodiscard]] const fusion_tuner& tuner() const noexcept
    requires autotuned
  {
    return *tuner_;
  }

  // ---- checkpoint (docs/DESIGN.md, "Checkpoints") ----------------------------------------------
  /// Writes this rank's state to `out`: everything that determines future gradients (the
  /// iteration counter that drives warm-up and density schedules, the fusion numbers, a Hybrid
  /// threshold, the sparsifier's residuals, CSC history, selection, norms and settings, Top-k
  /// schedules), in gflow's versioned binary format (support/checkpoint.hpp). Between iterations
  /// only (usage_error otherwise); every rank saves its own (residuals differ per rank).
  void save_state(std::ostream& out) const { detail::state_io::save(*this, out); }

  /// Restores what save_state wrote on the same rank, in a job of the same size (another size:
  /// gflow::load_resharded, <gflow/reshard.hpp>), into an exchanger of the same layout and
  /// composition; the next iterations are then bitwise the saver's. Between iterations only.
  /// A truncated or corrupt checkpoint raises parse_error, one of another layout, composition,
  /// rank or size mismatch_error naming what differs; the exchanger is then unchanged (the
  /// whole checkpoint is read and validated before anything is applied).
  void load_state(std::istream& in) { detail::state_io::load(*this, in); }

 private:
  friend struct detail::training_loop;
  friend struct detail::state_io;
  friend struct detail::tuning;
  friend struct detail::sharding_steps;
  // The cross-rank check (exchanger/consistency.hpp), run first: before the topology's splits or
  // any other collective, so ranks that disagree fail instead of hanging.
  static Layout verified(T& t, Layout layout, const exchange_options& opt) {
    if (opt.verify)
      detail::verify_consistency(t, layout, detail::composition_name<Set>(),
                                 {opt.average, opt.find_unused, opt.learn_order, opt.uneven_inputs});
    return layout;
  }

  static constexpr bool topology_has_state = detail::checkpointed<engine_t>;

  [[nodiscard]] detail::checkpoint_identity identity_for_checkpoint() const {
    return detail::make_checkpoint_identity<Set>(layout_, t_->rank(), t_->size(), pool_.total);
  }

  void between_iterations(const char* what) const { iteration_state::between_iterations(layout_, what); }

  void plan(std::size_t threshold, std::size_t first) {
    threshold_ = threshold;
    first_bucket_ = first;
    buckets_ = detail::plan::plan_buckets(layout_, pool_, {sizeof(wire_t), threshold, first});
    if constexpr (sharded) detail::sharding_steps::plan(*this, !sparsifier_.has_value());
  }

  void check_index(std::size_t i, const char* where) const { iteration_state::check_index(layout_, i, where); }

  // Tensor i is ready: by the trainer's ready(i), or filled by the exchanger (training_loop.hpp).
  // While the order is being learned nothing launches before finish().
  void mark(std::size_t i, std::uint8_t how) {
    if constexpr (sharded)
      if (ready_count_ == 0) {
        if constexpr (autotuned) detail::tuning::apply_pending(*this);  // the tuner's plan, held back by finish()
        detail::sharding_steps::sync(*this);  // the topology's split moved (Hybrid's threshold): the shards follow
      }
    ready_[i] = how;
    if (trace_) [[unlikely]] trace_ready(i);
    ++ready_count_;
    if (learning_) order_.push_back(i);
    else advance();
  }

  // Launch every bucket the contiguous ready prefix now covers, in pool order.
  void advance() {
    const std::size_t n = layout_.size();
    while (prefix_pos_ < n && ready_[pool_.tensor_at[prefix_pos_]]) ++prefix_pos_;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].end_pos <= prefix_pos_) launch(next_bucket_++);
  }

  // Hands bucket b to the Overlap policy's runner: exchanged here (None), or posted to the
  // issuing thread(s). Stream-ordered backends queue it on the transport's stream.
  void launch(std::size_t b) {
    if (trace_) [[unlikely]]
      trace_->instant(trace_kind::launch, static_cast<std::uint32_t>(b), iteration_, buckets_[b].count * sizeof(wire_t));
    kernels_.order_after_producer();
    runner_->post(b);
  }

  void trace_ready(std::size_t i) {
    const std::int64_t t = timeline::now_ns();
    if (ready_count_ == 0) iteration_begin_ = t;
    trace_->span(trace_kind::ready, static_cast<std::uint32_t>(i), iteration_, t, t);
  }
  void trace_finish(std::int64_t begin) {
    const std::int64_t t = timeline::now_ns();
    trace_->span(trace_kind::finish, 0, iteration_, begin, t);
    trace_->span(trace_kind::iteration, 0, iteration_, iteration_begin_, t);
  }

  void replan_fusion(std::size_t threshold, std::size_t first) {
    plan(threshold, first);
    sparsifier_->replan();
    runner_->replan();
  }

  T* t_;
  Layout layout_;
  exchange_options opt_;
  detail::plan::pool_plan pool_;
  typename backend::template buffer<float> grads_;
  typename backend::context kernels_;
  engine_t engine_;
  std::vector<detail::plan::bucket> buckets_;
  detail::plan::shard_plan shards_;  // Sharding<ReduceScatter> only
  detail::shard_history shard_log_;
  context_t cx_{};
  std::optional<sparsifier_t> sparsifier_;
  std::optional<runner_t> runner_;  // last: its issuing threads stop before anything they use goes
  std::size_t threshold_ = 0;
  std::size_t first_bucket_ = 0;  // as planned (for checkpoints)
  timeline* trace_ = nullptr;         // null: no timeline (one branch per hook)
  std::int64_t iteration_begin_ = 0;  // timeline: the iteration's first ready()
  // Fusion<Auto> only
  std::unique_ptr<timeline> own_timeline_;
  std::optional<detail::fusion_tuner> tuner_;
  tuner_sample sample_;
  std::size_t tuned_mark_ = 0;
  std::optional<detail::fusion_plan> pending_plan_;  // with Sharding: applied at the next first ready()
};

}  // namespace detail

/// A policy composition. `Exchanger<...>::on<Transport>` is the object a trainer uses.
template <class... Policies>
struct Exchanger {
  using policies = detail::policy_set<Policies...>;
  template <class T>
  using on = detail::basic_exchanger<T, policies>;
};

}  // namespace gflow
