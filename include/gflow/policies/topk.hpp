#pragma once
// Sparsifier<TopK<density>> and Sparsifier<GTopK<density>>: Top-k sparsification with
// residuals (paper 003 Algorithm 1) and global Top-k by a tree of pairwise merges
// (paper 003 Algorithms 3 and 4), for any number of ranks.
//
//   using Exchange = gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.001>>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   ex.sparsifier().set_schedule(gflow::plan::density_schedule::paper003(iterations_per_epoch));
//
// The density is a C++20 floating-point template argument (g++ 12 and nvcc 13 accept it); it
// must lie in (0, 1] (static_assert). It is the final density of the default schedule; the
// schedule is settable at run time (set_density, set_schedule; plan/density.hpp), validated.
//
// What one selection does, on a unit of n pool elements — each fused bucket when Fusion is
// present, else the whole pool once its last bucket is ready:
//   1. G = g + residual, stored into the residual (the pool keeps the gradients g until the
//      result is written: a rejected message leaves it untouched).
//   2. k = ceil(density * n) (plan::k_for); exact top-k of |G|, ties to the lower index
//      (kernels/topk.hpp). Steps 1 and 2 are one kernel, kernels::accumulate_select_topk: a
//      sampled threshold, one pass that stores G and gathers the candidates above it, a radix
//      select among them; the full three-pass selection only when the sample misjudged (same
//      result either way). Values travel in the Precision policy's wire type: with a 16-bit wire
//      and averaging they are divided by P before the cast (as the dense path does), and the
//      rounding error stays in the residual. Indices are pool positions, u32 when the pool has
//      at most 2^32 elements, else u64 (set_index_bytes overrides, validated).
//   3. residual = G minus what was sent.
//   Per unit that is one pass reading g and the residual and writing the residual, one write of
//   zeros over the unit once every message is validated, and work on k-sized lists (TopK
//   averages and counts inf / NaN at the union of the received indices only: every other
//   element is +0, and +0 * (1/P) = +0). Without Fusion the buckets before the last wait:
//   nothing reads G before the whole pool's selection, so the last bucket's call runs the one
//   pass over the whole pool; accumulating each bucket as it arrives and then selecting would
//   read the pool once more. (With an Overlap policy those per-bucket accumulations could have
//   hidden behind the backward pass; now all of a unit's work follows its last bucket.)
//   TopK : ONE all_gather of a packed message (header + k indices + k values, as bytes) per rank;
//          every rank validates all P messages, zeroes the unit and adds them in rank order 0..P-1
//          (bitwise identical everywhere), then averages (fp32: multiply by 1/P, as Dense does).
//   GTopK: ceil(log2 P) rounds of send/recv of one fixed-size message (plan/tree.hpp: in round j
//          rank r receives from r + 2^j when r % 2^(j+1) == 0 and that rank exists; the sender is
//          idle afterwards); the receiver merges (add equal indices, keep the k largest |sum| of
//          at most 2k, kernels::merge_topk) into its list; then rank 0 broadcasts the global list,
//          which every rank validates and writes (divided by P when averaging) into the zeroed
//          unit. Residuals, so that nothing is lost (shared DESIGN "Nothing is lost"):
//            - Algorithm 4 line 10: a rank's selected values whose index is not in the global
//              list go back into its residual;
//            - a merge that drops an entry whose index does end up in the global list (it got
//              there through another branch of the tree) puts the dropped sum back into the
//              merging rank's residual, and so does a merge whose 16-bit re-encoding rounded.
//              Algorithm 4 alone would lose those values; with both rules the sum over ranks of
//              everything fed in equals P x the applied average plus every residual.
//
// Received messages are validated before use (count <= k, index in the unit, strictly
// increasing indices, no NaN value; see kernels/topk.hpp for the format). A bad message raises
// gflow::parse_error whose subject names the parameter ("count", "index", "value") on EVERY rank:
// TopK's ranks all see the same gathered bytes; a GTopK rank that rejects a message marks its
// outgoing message and rank 0's broadcast carries the mark, so no rank waits for one that gave
// up. Before throwing, every rank puts its own selected values back into its residual, so the
// failed iteration's gradients are not lost (they are exchanged with the next iteration).
//
// Non-finite gradients: NaN travels as +inf (a received NaN is a corrupt message), inf values
// are applied and reported by Exchanger::finish(); non-finite values never enter a residual.
// They rank above every finite value, so they are selected first; should a rank hold more than
// k in a unit, it sends k (so the result is non-finite on every rank) and drops the rest. A
// finite value whose wire encoding overflows (fp16) travels as inf and is dropped likewise.
//
// Checkpoints (Exchanger::save_state / load_state): the residual, the density schedule, the
// index width and the last iteration's density. selected() / exchanged() are per iteration and
// start empty after a load.
//
// Introspection: residual() (pool order), selected() (this rank's indices this iteration),
// exchanged() (the indices the applied result has: TopK the union over ranks, GTopK the global
// top-k), k(), wire_bytes(), message_bytes(). Every rank must use the same layout, fusion,
// schedule and index width; change them between iterations only.
//
// Memory spaces: the engine is written once over the backend (detail/concepts.hpp, topk_backend):
// host_backend forwards to kernels/topk.hpp; device_backend (NCCL, gflow::inproc_device) runs the
// CUDA twins (cuda/topk.cuh, cuda/topk_engine.cuh) on the transport's stream. On device memory the
// values never come to the host: each message's verdict and each merge's counts do (a few bytes,
// one stream synchronisation each, because the host logic below decides from them), selected() /
// exchanged() stay empty, and TopK averages over the whole unit (the same bits as over the union).
// docs/DESIGN.md, "Device memory", lists every transfer. Buffers are sized for the schedule's
// largest density when the engine is built, replanned or given a schedule; an iteration allocates
// nothing (the device selector and mergers are built on their first use).
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../support/checkpoint.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "../kernels/topk.hpp"
#include "../plan/density.hpp"
#include "../plan/tree.hpp"
#include "../timeline.hpp"
#include "family.hpp"
#include "sparsifier.hpp"

namespace gflow {

namespace detail {

// Typed scratch for one index width (u32 or u64), in the backend's memory; only the width in use
// is allocated.
template <class I, class W, class B>
struct topk_lists {
  template <class E>
  using buf = typename B::template buffer<E>;
  buf<I> mine_idx, cur_idx, tmp_idx, recv_idx;
  buf<W> mine_val, cur_val, tmp_val, recv_val;
  buf<I> u_idx;                       // merge union, 2k (host merge scratch)
  buf<float> u_sum;                   // 2k
  buf<std::uint32_t> u_key;           // 2k
  buf<I> rec_idx;                     // merge records, rounds x 2k
  buf<float> rec_val;
  std::vector<std::size_t> rec_count; // per round (host)

  void size_for(std::size_t k, int rounds, bool global) {
    mine_idx = buf<I>(k);
    recv_idx = buf<I>(k);
    mine_val = buf<W>(k);
    recv_val = buf<W>(k);
    if (global) {
      cur_idx = buf<I>(k);
      tmp_idx = buf<I>(k);
      cur_val = buf<W>(k);
      tmp_val = buf<W>(k);
      u_idx = buf<I>(2 * k);
      u_sum = buf<float>(2 * k);
      u_key = buf<std::uint32_t>(2 * k);
      rec_idx = buf<I>(static_cast<std::size_t>(rounds) * 2 * k);
      rec_val = buf<float>(static_cast<std::size_t>(rounds) * 2 * k);
      rec_count.assign(static_cast<std::size_t>(rounds), 0);
    }
  }
  void release() { *this = topk_lists{}; }
};

template <class Ctx, double Density, bool Global>
class topk_engine {
  using T = typename Ctx::transport_type;
  using W = typename Ctx::wire_type;
  using B = typename Ctx::backend;
  static_assert(topk_backend<B>,
                "gflow::Sparsifier<TopK<d>> / Sparsifier<GTopK<d>>: the memory space's backend has no Top-k kernels "
                "(gflow::detail::topk_backend, include/gflow/detail/concepts.hpp).");
  template <class E>
  using buffer = typename B::template buffer<E>;
  // Host memory: every list is readable here, and selected() / exchanged() are filled. Device
  // memory: lists stay on the device; only verdicts and counts come to the host (see below).
  static constexpr bool on_host = !B::stream_ordered;
  static constexpr const char* scheme_name = Global ? "GTopK" : "TopK";

 public:
  static constexpr bool global = Global;
  // The exchange of a unit is one blocking step, and state (residual, whole-pool selection
  // without Fusion) crosses buckets: no start/complete phases, no independent buckets.
  static constexpr bool phased = false;
  static constexpr bool independent_buckets = false;

  explicit topk_engine(Ctx& cx) : cx_(&cx), schedule_(plan::density_schedule::constant(Density)) {
    wide_ = cx.pool->total > (std::uint64_t{1} << 32);
    residual_ = buffer<float>(cx.pool->total);
    replan();
  }

  // ---- the sparsifier engine interface ----------------------------------------------------
  void replan() {
    const auto& bks = *cx_->buckets;
    fused_ = cx_->fused();
    const int P = cx_->transport->size();
    const int rank = cx_->transport->rank();
    const double dmax = schedule_.max();
    std::size_t kcap = 0, ktotal = 0, ucap = 0, utotal = 0;
    auto unit = [&](std::size_t n) {
      const std::size_t k = plan::k_for(dmax, n);
      kcap = std::max(kcap, k);
      ktotal += k;
      const std::size_t u = Global ? k : std::min(n, k * static_cast<std::size_t>(P));
      ucap = std::max(ucap, u);
      utotal += u;
    };
    if (fused_) {
      for (const auto& b : bks) unit(b.count);
    } else {
      unit(cx_->pool->total);
    }
    kcap_ = kcap;
    ws_.release();
    if (fused_) {
      for (const auto& b : bks) ws_.reserve(b.count, plan::k_for(dmax, b.count));
    } else {
      ws_.reserve(cx_->pool->total, plan::k_for(dmax, cx_->pool->total));
    }
    selected_.assign(ktotal, 0);
    exchanged_.assign(utotal, 0);
    steps_.clear();
    if constexpr (Global) {
      steps_ = plan::gtopk_schedule(rank, P);
      decoded_ = buffer<float>(kcap);
    } else {
      if constexpr (on_host) {
        union_a_.assign(ucap, 0);
        union_b_.assign(ucap, 0);
      }
      decoded_ = buffer<float>(ucap);
    }
    size_lists();
    const std::size_t mb = sparse_message::bytes(kcap, index_bytes(), sizeof(W));
    send_msg_ = buffer<std::uint8_t>(mb);
    if constexpr (Global) {
      recv_msg_ = buffer<std::uint8_t>(mb);
      bcast_msg_ = buffer<std::uint8_t>(mb);
    } else {
      gather_ = buffer<std::uint8_t>(mb * static_cast<std::size_t>(P));
    }
    const float Pf = static_cast<float>(P);
    scale_ = (Ctx::narrow && cx_->average) ? 1.0f / Pf : 1.0f;
    unscale_ = (Ctx::narrow && cx_->average) ? Pf : 1.0f;
  }

  void exchange(std::size_t b) {
    if (b == 0) begin_iteration();
    const auto& bk = (*cx_->buckets)[b];
    // Without Fusion the earlier buckets wait for the last: its selection accumulates the whole
    // pool in the same pass (see the header).
    if (fused_) select_and_exchange(bk.offset, bk.count);
    else if (b + 1 == cx_->buckets->size()) select_and_exchange(0, cx_->pool->total);
  }

  void end_iteration() {}

  /// Transport calls this rank made this iteration: one all_gather per selection (TopK); per
  /// selection the tree's sends / receives plus the broadcast (GTopK).
  [[nodiscard]] std::size_t collectives() const noexcept {
    if constexpr (!Global) return selections_;
    std::size_t active = 0;
    for (const auto& st : steps_) active += st.role != plan::tree_role::idle;
    return selections_ * (active + 1);  // the broadcast is issued for every P
  }

  /// Bytes this rank handed to collectives this iteration (all_gather / send / broadcast buffers).
  [[nodiscard]] std::size_t wire_bytes() const noexcept { return wire_bytes_; }

  // ---- run-time settings (between iterations; the same on every rank) ----------------------
  /// A constant density from now on. Throws invalid_argument("density") unless 0 < d <= 1.
  void set_density(double d) {
    plan::check_density(d);
    set_schedule(plan::density_schedule::constant(d));
  }
  /// A warm-up schedule (already validated when built); buffers grow to its largest density.
  void set_schedule(plan::density_schedule s) {
    schedule_ = std::move(s);
    replan();
  }
  [[nodiscard]] const plan::density_schedule& schedule() const noexcept { return schedule_; }
  /// The density of the current (or, between iterations, the last) iteration.
  [[nodiscard]] double density() const noexcept { return density_; }

  /// 4 (u32 indices; only when the pool has at most 2^32 elements) or 8 (u64).
  void set_index_bytes(std::size_t bytes) {
    if (bytes != 4 && bytes != 8)
      throw invalid_argument("index_bytes", "indices travel as 4 or 8 bytes (got " + std::to_string(bytes) + ").", "pass 4 or 8.");
    if (bytes == 4 && cx_->pool->total > (std::uint64_t{1} << 32))
      throw invalid_argument("index_bytes",
                             "the pool has " + std::to_string(cx_->pool->total) + " elements; 32-bit indices address at most 2^32.",
                             "keep 8-byte indices for this layout.");
    wide_ = bytes == 8;
    replan();
  }
  [[nodiscard]] std::size_t index_bytes() const noexcept { return wide_ ? 8 : 4; }

  // ---- checkpoint (Exchanger::save_state / load_state; between iterations) --------------------
  /// What load reads and validates before anything changes; restore_state applies it.
  struct saved_state {
    std::vector<float> residual;
    plan::density_schedule schedule = plan::density_schedule::constant(Density);
    bool wide = false;
    double density = Density;
  };

  void save_state(checkpoint_writer& w) const {
    w.u32(static_cast<std::uint32_t>(index_bytes()));
    w.f64(density_);
    w.u64(schedule_.steps().size());
    for (const auto& st : schedule_.steps()) {
      w.u64(st.until);
      w.f64(st.density);
    }
    w.f64(schedule_.final_density());
    if constexpr (on_host) {
      w.array(residual_.data(), residual_.size());
    } else {  // the checkpoint is written by the host: the residual comes down here
      std::vector<float> res(residual_.size());
      cx_->kernels->download(res.data(), residual_.data(), res.size());
      w.array(res.data(), res.size());
    }
  }

  [[nodiscard]] saved_state read_state(checkpoint_reader& r) const {
    saved_state s;
    const std::uint32_t ib = r.u32("index_bytes");
    if (ib != 4 && ib != 8) r.fail("index_bytes", "the checkpoint's index width is " + std::to_string(ib) + " bytes (4 or 8 expected).");
    if (ib == 4 && cx_->pool->total > (std::uint64_t{1} << 32))
      r.fail("index_bytes", "the checkpoint uses 32-bit indices for a pool of more than 2^32 elements.");
    s.wide = ib == 8;
    s.density = r.f64("density");
    if (!(s.density > 0.0 && s.density <= 1.0)) r.fail("density", "the checkpoint's density " + std::to_string(s.density) + " is outside (0, 1].");
    const std::uint64_t nsteps = r.u64("the density schedule's step count");
    constexpr std::uint64_t max_steps = std::uint64_t{1} << 20;
    if (nsteps > max_steps)
      r.fail("density_schedule", "the checkpoint's density schedule claims " + std::to_string(nsteps) + " steps; at most " + std::to_string(max_steps) + " are allowed.");
    std::vector<plan::density_step> steps;
    for (std::uint64_t i = 0; i < nsteps; ++i) {
      plan::density_step st;
      st.until = r.u64("a density schedule step");
      st.density = r.f64("a density schedule step");
      steps.push_back(st);
    }
    const double fin = r.f64("the final density");
    try {
      s.schedule = plan::density_schedule::per_iteration(std::move(steps), fin);
    } catch (const invalid_argument& e) {
      r.fail("density_schedule", std::string("the checkpoint's density schedule is invalid: ") + e.what());
    }
    r.array_exact(s.residual, cx_->pool->total, "the residual");
    check_finite(s.residual.data(), s.residual.size(), "residual");
    return s;
  }

  /// Applies a validated state (read_state). Buffers are re-sized for the schedule (as
  /// set_schedule does); the per-iteration introspection starts empty.
  void restore_state(saved_state&& s) {
    cx_->kernels->upload(residual_.data(), s.residual.data(), s.residual.size());
    schedule_ = std::move(s.schedule);
    wide_ = s.wide;
    density_ = s.density;
    wire_bytes_ = selected_n_ = exchanged_n_ = k_total_ = selections_ = message_bytes_ = 0;
    replan();
  }

  // ---- introspection ------------------------------------------------------------------------
  /// The residual, in pool order (pool_data() indexing), in the backend's memory (device memory:
  /// a device span).
  [[nodiscard]] std::span<const float> residual() const noexcept { return {residual_.data(), residual_.size()}; }
  /// Pool indices this rank selected this iteration (increasing). Host memory only: on device
  /// memory the lists stay on the device and this is empty.
  [[nodiscard]] std::span<const std::uint64_t> selected() const noexcept { return {selected_.data(), selected_n_}; }
  /// Pool indices the applied result holds a value for this iteration (increasing): TopK the
  /// union of every rank's selection, GTopK the global top-k. Identical on every rank. Host memory
  /// only (empty on device memory).
  [[nodiscard]] std::span<const std::uint64_t> exchanged() const noexcept { return {exchanged_.data(), exchanged_n_}; }
  /// Entries each rank selected this iteration, summed over the selection units.
  [[nodiscard]] std::size_t k() const noexcept { return k_total_; }
  /// Selections (units) exchanged this iteration: buckets with Fusion, else 1.
  [[nodiscard]] std::size_t selections() const noexcept { return selections_; }
  /// Bytes of the last message (header + k indices + k values).
  [[nodiscard]] std::size_t message_bytes() const noexcept { return message_bytes_; }
  /// Merge rounds of GTopK (ceil(log2 P)); 0 for TopK.
  [[nodiscard]] int rounds() const noexcept { return static_cast<int>(steps_.size()); }

  /// How this rank's selections of this iteration ran (kernels::topk_path): the result is the
  /// same on every path, the time is not. `full`: not sampled (small unit, large density);
  /// `candidates`: about one pass; `too_few` / `overflow`: the sampled threshold missed and the
  /// full selection ran as well.
  struct selection_paths {
    std::size_t full = 0, candidates = 0, too_few = 0, overflow = 0;
  };
  [[nodiscard]] selection_paths paths() const noexcept { return paths_; }

 private:
  template <class I>
  topk_lists<I, W, B>& lists() noexcept {
    if constexpr (std::same_as<I, std::uint32_t>) return l32_;
    else return l64_;
  }

  void size_lists() {
    if (wide_) {
      l32_.release();
      l64_.size_for(kcap_, static_cast<int>(steps_.size()), Global);
    } else {
      l64_.release();
      l32_.size_for(kcap_, static_cast<int>(steps_.size()), Global);
    }
  }

  void begin_iteration() {
    density_ = schedule_.at(*cx_->iteration);
    wire_bytes_ = 0;
    selected_n_ = 0;
    exchanged_n_ = 0;
    k_total_ = 0;
    selections_ = 0;
    paths_ = {};
  }

  void select_and_exchange(std::size_t off, std::size_t n) {
    if (wide_) run<std::uint64_t>(off, n);
    else run<std::uint32_t>(off, n);
  }

  template <class I>
  void run(std::size_t off, std::size_t n) {
    auto& L = lists<I>();
    const std::size_t k = plan::k_for(density_, n);
    const std::size_t mb = sparse_message::bytes(k, sizeof(I), sizeof(W));
    auto& kern = *cx_->kernels;
    float* res = residual_.data();  // holds G from here until take_selected
    detail::stage_clock sc(cx_->tracer());  // timeline: the selection (a span when one is attached)
    const auto sel = kern.accumulate_select_topk(cx_->grads + off, res + off, n, k, off, L.mine_idx.data(), ws_);
    count_path(sel.path);
    const std::size_t cnt = sel.count;
    // More inf/NaN than the selection holds: the rest must not stay in the residual (decided on
    // G, before the take overwrites the selected elements).
    kern.take_selected_dropping(res, off, n, L.mine_idx.data(), cnt, L.mine_val.data(), scale_, unscale_, ws_);
    sc.lap(trace_kind::select, 0, *cx_->iteration, n * sizeof(W));
    if constexpr (on_host) {
      for (std::size_t j = 0; j < cnt; ++j) selected_[selected_n_ + j] = static_cast<std::uint64_t>(L.mine_idx.data()[j]);
      selected_n_ += cnt;
    }
    k_total_ += k;
    ++selections_;
    message_bytes_ = mb;
    if constexpr (Global) run_global<I>(off, n, k, mb, cnt);
    else run_gather<I>(off, n, k, mb, cnt);
  }

  void count_path(kernels::topk_path p) noexcept {
    switch (p) {
      case kernels::topk_path::full: ++paths_.full; break;
      case kernels::topk_path::candidates: ++paths_.candidates; break;
      case kernels::topk_path::too_few: ++paths_.too_few; break;
      case kernels::topk_path::overflow: ++paths_.overflow; break;
    }
  }

  // Puts this rank's own selection back into its residual (the exchange failed).
  template <class I>
  void restore_own(std::size_t cnt) {
    auto& L = lists<I>();
    cx_->kernels->restore_unselected(residual_.data(), L.mine_idx.data(), L.mine_val.data(), cnt, static_cast<const I*>(nullptr), 0, unscale_);
  }

  std::string fix_text() const {
    return "make every rank use the same layout, fusion, density schedule and index width; otherwise the transport "
           "delivered corrupted bytes. This iteration's gradients were not exchanged; they stay in the residual.";
  }

  // ---- TopK: one all_gather ----------------------------------------------------------------
  template <class I>
  void run_gather(std::size_t off, std::size_t n, std::size_t k, std::size_t mb, std::size_t cnt) {
    auto& L = lists<I>();
    auto& kern = *cx_->kernels;
    T& t = *cx_->transport;
    const int P = t.size();
    kern.pack(send_msg_.data(), k, L.mine_idx.data(), L.mine_val.data(), cnt);
    detail::stage_clock sc(cx_->tracer());
    t.all_gather(send_msg_.data(), gather_.data(), mb);
    sc.lap(trace_kind::collective, 0, *cx_->iteration, mb);
    wire_bytes_ += mb;
    // Validate all P messages before the pool is touched (device memory: each verdict comes to
    // the host, the entries stay on the device).
    for (int q = 0; q < P; ++q) {
      const auto r = kern.unpack_checked(block(q, mb), k, off, off + n, L.recv_idx.data(), L.recv_val.data(), ws_);
      if (!r.ok()) {
        restore_own<I>(cnt);
        throw parse_error(sparse_message::parameter_of(r.fault),
                          std::string("Sparsifier<TopK>: the message all-gathered from rank ") + std::to_string(q) + " was rejected: " +
                              sparse_message::describe(r, k, off, off + n),
                          fix_text());
      }
    }
    float* g = cx_->grads + off;
    kern.fill_zero(g, n);
    std::size_t ua = 0;
    for (int q = 0; q < P; ++q) {  // rank order: the same additions, in the same order, on every rank
      const auto r = kern.unpack_checked(block(q, mb), k, off, off + n, L.recv_idx.data(), L.recv_val.data(), ws_);
      kern.scatter_add(cx_->grads, L.recv_idx.data(), L.recv_val.data(), r.count);
      if constexpr (on_host) {
        const I* ri = L.recv_idx.data();
        const auto end = std::set_union(union_a_.data(), union_a_.data() + ua, ri, ri + r.count, union_b_.data());
        ua = static_cast<std::size_t>(end - union_b_.data());
        std::swap(union_a_, union_b_);
      }
    }
    if constexpr (on_host) {
      std::copy(union_a_.data(), union_a_.data() + ua, exchanged_.data() + exchanged_n_);
      exchanged_n_ += ua;
      // Only the union's elements can differ from +0 (and +0 * (1/P) = +0): average and count
      // inf / NaN there.
      if (!Ctx::narrow && cx_->average) kernels::scale_at(cx_->grads, union_a_.data(), ua, cx_->mean_scale(), decoded_.data());
      else kernels::gather_at(cx_->grads, union_a_.data(), ua, decoded_.data());
      kern.count_nonfinite(decoded_.data(), ua);
    } else {
      // The union's indices stay on the device: average / count over the whole unit, which gives
      // the same bits (every other element is +0, and +0 * (1/P) = +0, finite) for one more pass.
      if (!Ctx::narrow && cx_->average) kern.scale_in_place(g, n, cx_->mean_scale());
      else kern.count_nonfinite(g, n);
    }
  }

  const std::uint8_t* block(int q, std::size_t mb) const noexcept { return gather_.data() + static_cast<std::size_t>(q) * mb; }

  // ---- GTopK: tree of merges, then a broadcast --------------------------------------------
  template <class I>
  void run_global(std::size_t off, std::size_t n, std::size_t k, std::size_t mb, std::size_t cnt) {
    auto& L = lists<I>();
    auto& kern = *cx_->kernels;
    T& t = *cx_->transport;
    const int rank = t.rank();
    kern.copy_n(L.cur_idx.data(), L.mine_idx.data(), cnt);
    kern.copy_n(L.cur_val.data(), L.mine_val.data(), cnt);
    std::size_t cur = cnt;
    detail::stage_clock sc(cx_->tracer());  // timeline: the tree's rounds and the broadcast, as one collective span
    sparse_message::header mark{};  // status != 0 once this rank saw a bad message (or a marked one)
    sparse_message::unpack_result own{};    // what this rank itself rejected
    int own_peer = -1;
    for (std::size_t j = 0; j < steps_.size(); ++j) {
      const plan::tree_step& s = steps_[j];
      L.rec_count[j] = 0;
      if (s.role == plan::tree_role::receive) {
        t.recv(recv_msg_.data(), mb, s.peer);
        // Device memory: the verdict (and below the merge's counts) come to the host, because the
        // host decides whether to merge or forward a fault and how many entries the next message holds.
        const auto r = kern.unpack_checked(recv_msg_.data(), k, off, off + n, L.recv_idx.data(), L.recv_val.data(), ws_);
        if (!r.ok()) {
          if (mark.status == 0) {
            if (r.fault == sparse_message::fault_code::status) {
              mark = r.header;  // forward the upstream report unchanged
            } else {
              mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(s.peer),
                      static_cast<std::uint32_t>(j)};
              own = r;
              own_peer = s.peer;
            }
          }
          continue;
        }
        if (mark.status != 0) continue;
        std::size_t nrec = 0;
        const std::size_t base = j * 2 * kcap_;
        cur = kern.merge_topk(L.recv_idx.data(), L.recv_val.data(), r.count, L.cur_idx.data(), L.cur_val.data(), cur, k, L.tmp_idx.data(),
                              L.tmp_val.data(), L.rec_idx.data() + base, L.rec_val.data() + base, &nrec,
                              kernels::merge_scratch<I>{L.u_idx.data(), L.u_sum.data(), L.u_key.data()}, ws_);
        L.rec_count[j] = nrec;
        std::swap(L.cur_idx, L.tmp_idx);
        std::swap(L.cur_val, L.tmp_val);
      } else if (s.role == plan::tree_role::send) {
        kern.pack(send_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), mark.status ? 0 : cur, mark);
        t.send(send_msg_.data(), mb, s.peer);
        wire_bytes_ += mb;
      }
    }
    if (rank == 0) kern.pack(bcast_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), mark.status ? 0 : cur, mark);
    else kern.pack(bcast_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), 0);  // overwritten by the broadcast
    t.broadcast(bcast_msg_.data(), mb, 0);
    sc.lap(trace_kind::collective, 0, *cx_->iteration, mb);
    wire_bytes_ += mb;
    // The global list, into tmp (cur is no longer needed).
    const auto F = kern.unpack_checked(bcast_msg_.data(), k, off, off + n, L.tmp_idx.data(), L.tmp_val.data(), ws_);
    if (!F.ok() || mark.status != 0) {  // a rank rejected a message: every rank learns it from the broadcast
      restore_own<I>(cnt);
      fail_global(F, mark, own, own_peer, k, off, n);
    }
    const std::size_t nf = F.count;
    const I* fi = L.tmp_idx.data();
    float* g = cx_->grads;
    kern.fill_zero(g + off, n);
    const float post = (!Ctx::narrow && cx_->average) ? cx_->mean_scale() : 1.0f;
    kern.decode_scatter_counted(g, fi, L.tmp_val.data(), nf, post, decoded_.data());
    // Residuals: Algorithm 4 line 10, then the merge records of indices in the global list.
    kern.restore_unselected(residual_.data(), L.mine_idx.data(), L.mine_val.data(), cnt, fi, nf, unscale_);
    for (std::size_t j = 0; j < steps_.size(); ++j) {
      const std::size_t base = j * 2 * kcap_;
      kern.restore_records_in(residual_.data(), L.rec_idx.data() + base, L.rec_val.data() + base, L.rec_count[j], fi, nf, unscale_);
    }
    if constexpr (on_host) {
      for (std::size_t j = 0; j < nf; ++j) exchanged_[exchanged_n_ + j] = static_cast<std::uint64_t>(fi[j]);
      exchanged_n_ += nf;
    }
  }

  // Throws the error of a failed gTop-k exchange: a rejected message reported through the tree
  // (this rank's own mark, or the mark the broadcast carried), else the broadcast itself.
  [[noreturn]] void fail_global(const sparse_message::unpack_result& F, const sparse_message::header& mark, const sparse_message::unpack_result& own,
                                int own_peer, std::size_t k, std::size_t off, std::size_t n) const {
    const sparse_message::header* h = mark.status != 0 ? &mark : (F.fault == sparse_message::fault_code::status ? &F.header : nullptr);
    if (h != nullptr) {
      const auto fault = static_cast<sparse_message::fault_code>(h->status);
      std::string what = "Sparsifier<GTopK>: in merge round " + std::to_string(h->round) + ", rank " + std::to_string(h->reporter) +
                         " rejected the message from rank " + std::to_string(h->source) + " (its " + sparse_message::parameter_of(fault) + ")";
      if (own_peer >= 0) what += ": " + sparse_message::describe(own, k, off, off + n);
      else what += "; every rank stops this exchange.";
      throw parse_error(sparse_message::parameter_of(fault), what, fix_text());
    }
    throw parse_error(sparse_message::parameter_of(F.fault),
                      "Sparsifier<GTopK>: the global top-k broadcast from rank 0 was rejected: " + sparse_message::describe(F, k, off, off + n), fix_text());
  }

  Ctx* cx_;
  plan::density_schedule schedule_;
  bool wide_ = false;
  bool fused_ = false;
  std::size_t kcap_ = 0;
  float scale_ = 1.0f;    // applied before encoding (1/P with a 16-bit wire and averaging)
  float unscale_ = 1.0f;  // its inverse, for residual bookkeeping
  buffer<float> residual_;
  typename B::template topk_scratch<W> ws_;
  buffer<std::uint8_t> send_msg_, recv_msg_, bcast_msg_, gather_;
  std::vector<std::uint64_t> selected_, exchanged_, union_a_, union_b_;  // host memory only: see selected()
  buffer<float> decoded_;  // GTopK: the global list's values; TopK: the union's results (host scratch)
  std::vector<plan::tree_step> steps_;
  topk_lists<std::uint32_t, W, B> l32_;
  topk_lists<std::uint64_t, W, B> l64_;
  // per iteration
  double density_ = Density;
  std::size_t wire_bytes_ = 0, selected_n_ = 0, exchanged_n_ = 0, k_total_ = 0, selections_ = 0, message_bytes_ = 0;
  selection_paths paths_{};
};

}  // namespace detail

/// Top-k sparsification, exchanged by one all_gather (paper 003 Algorithm 1).
template <double Density>
struct TopK {
  static_assert(Density > 0.0 && Density <= 1.0,
                "gflow::TopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, "
                "e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::Dense>.");
  static constexpr double density = Density;
  static constexpr bool global = false;
  template <class Ctx>
  using engine = detail::topk_engine<Ctx, Density, false>;
};

/// Global Top-k by pairwise tree merges and a broadcast (paper 003 Algorithms 3 and 4), any P.
template <double Density>
struct GTopK {
  static_assert(Density > 0.0 && Density <= 1.0,
                "gflow::GTopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, "
                "e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::Dense>.");
  static constexpr double density = Density;
  static constexpr bool global = true;
  template <class Ctx>
  using engine = detail::topk_engine<Ctx, Density, true>;
};

/// A Top-k scheme: its density (in (0, 1]) and whether the selection is global.
template <class S>
concept topk_scheme = requires {
  { S::density } -> std::convertible_to<double>;
  { S::global } -> std::convertible_to<bool>;
} && (S::density > 0.0) && (S::density <= 1.0);

static_assert(topk_scheme<TopK<0.001>>);
static_assert(topk_scheme<GTopK<0.001>>);
static_assert(topk_scheme<TopK<1.0>>);
static_assert(!topk_scheme<Dense>);
static_assert(sparsifier_policy<Sparsifier<TopK<0.001>>>);
static_assert(sparsifier_policy<Sparsifier<GTopK<0.01>>>);
// The Top-k engines meet gflow::detail::sparsifier_engine (detail/concepts.hpp).
static_assert(detail::sparsifier_engine<TopK<0.01>::engine<detail::archetype_context<>>, detail::archetype_context<>> &&
                  detail::sparsifier_engine<GTopK<0.01>::engine<detail::archetype_context<half>>, detail::archetype_context<half>> &&
                  detail::counts_collectives<TopK<0.01>::engine<detail::archetype_context<>>> &&
                  detail::counts_collectives<GTopK<0.01>::engine<detail::archetype_context<>>>,
              "gflow::TopK / GTopK engines must meet gflow::detail::sparsifier_engine");

}  // namespace gflow
