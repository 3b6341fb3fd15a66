#pragma once
// Include engines/topk.hpp, not this file: GTopK's members are defined in tree.hpp.
//
// detail::topk_engine: the engine of Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> (what they do,
// their accounting, non-finite values and checkpoints are described with the tags in
// policies/topk.hpp). This file holds the class, its checkpoint, the selection that both share
// and TopK's all_gather exchange; their run-time settings (shared with OkTopK) are in
// settings.hpp, GTopK's merge tree in tree.hpp (engines/topk.hpp includes this file and it). The
// contract is gflow::detail::sparsifier_engine (engines/concepts.hpp), asserted in engines/topk.hpp.
//
// Memory spaces: the engine is written once over the backend (engines/concepts.hpp, topk_backend):
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

#include "../../support/checkpoint.hpp"
#include "../../../dtype.hpp"
#include "../../../error.hpp"
#include "../../kernels/topk.hpp"
#include "../../plan/density.hpp"
#include "../../plan/tree.hpp"
#include "../../../timeline.hpp"
#include "../concepts.hpp"
#include "lists.hpp"
#include "settings.hpp"
#include "state.hpp"

namespace gflow::detail {

template <class Ctx, double Density, bool Global>
class topk_engine : public topk_settings<topk_engine<Ctx, Density, Global>> {
  using settings = topk_settings<topk_engine>;
  friend settings;
  using settings::schedule_;
  using settings::density_;
  using settings::wide_;
  using T = typename Ctx::transport_type;
  using W = typename Ctx::wire_type;
  using B = typename Ctx::backend;
  static_assert(topk_backend<B>,
                "gflow::Sparsifier<TopK<d>> / Sparsifier<GTopK<d>>: the memory space's backend has no Top-k kernels "
                "(gflow::detail::topk_backend, include/gflow/detail/engines/concepts.hpp).");
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

  explicit topk_engine(Ctx& cx) : settings(Density, cx.pool->total), cx_(&cx) {
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
    std::size_t kcap = 0, ktotal = 0, ucap = 0, utotal = 0, ncap = 0;
    auto unit = [&](std::size_t n) {
      const std::size_t k = plan::k_for(dmax, n);
      ncap = std::max(ncap, n);
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
        marks_.assign((ncap + 63) / 64, 0);  // all zero between iterations (take_marked clears)
        marks_summary_.assign((ncap + 4095) / 4096, 0);
      }
      decoded_ = buffer<float>(ucap);
    }
    size_lists();
    const std::size_t mb = sparse_message::bytes(kcap, this->index_bytes(), sizeof(W));
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

  // Run-time settings: set_density, set_schedule, schedule(), density(), set_index_bytes,
  // index_bytes() (topk_settings, settings.hpp; a new index width replans).

  // ---- checkpoint (Exchanger::save_state / load_state; between iterations) --------------------
  /// What load reads and validates before anything changes; restore_state applies it.
  struct saved_state {
    std::vector<float> residual;
    plan::density_schedule schedule = plan::density_schedule::constant(Density);
    bool wide = false;
    double density = Density;
  };

  void save_state(checkpoint_writer& w) const {
    write_topk_family_head(w, wide_, density_, schedule_);
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
    topk_family_head h;
    read_topk_family_state(r, cx_->pool->total, h, s.residual);
    s.wide = h.wide;
    s.density = h.density;
    s.schedule = std::move(h.schedule);
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

  void index_width_changed() { replan(); }

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
  // Rank q's message in the all_gather buffer.
  const std::uint8_t* block(int q, std::size_t mb) const noexcept { return gather_.data() + static_cast<std::size_t>(q) * mb; }
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
                          fmt::format("Sparsifier<TopK>: the message all-gathered from rank {} was rejected: "
                              "{}", q, sparse_message::describe(r, k, off, off + n)),
                          fix_text());
      }
    }
    float* g = cx_->grads + off;
    kern.fill_zero(g, n);
    for (int q = 0; q < P; ++q) {  // rank order: the same additions, in the same order, on every rank
      const auto r = kern.unpack_checked(block(q, mb), k, off, off + n, L.recv_idx.data(), L.recv_val.data(), ws_);
      kern.scatter_add(cx_->grads, L.recv_idx.data(), L.recv_val.data(), r.count);
      if constexpr (on_host) kernels::mark_bits(marks_.data(), marks_summary_.data(), L.recv_idx.data(), r.count, off);  // the union
    }
    if constexpr (on_host) {
      // the union in index order, straight into exchanged(): O(P k + n / 4096) (successive sorted
      // unions were O(P^2 k))
      std::uint64_t* const u = exchanged_.data() + exchanged_n_;
      const std::size_t ua = kernels::take_marked(marks_.data(), marks_summary_.data(), (n + 4095) / 4096, off, u);
      exchanged_n_ += ua;
      // Only the union's elements can differ from +0 (and +0 * (1/P) = +0): average and count
      // inf / NaN there.
      if (!Ctx::narrow && cx_->average) kernels::scale_at(cx_->grads, u, ua, cx_->mean_scale(), decoded_.data());
      else kernels::gather_at(cx_->grads, u, ua, decoded_.data());
      kern.count_nonfinite(decoded_.data(), ua);
    } else {
      // The union's indices stay on the device: average / count over the whole unit, which gives
      // the same bits (every other element is +0, and +0 * (1/P) = +0, finite) for one more pass.
      if (!Ctx::narrow && cx_->average) kern.scale_in_place(g, n, cx_->mean_scale());
      else kern.count_nonfinite(g, n);
    }
  }

  // ---- GTopK: tree of merges, then a broadcast (engines/topk/tree.hpp) ----------------------
  template <class I>
  void run_global(std::size_t off, std::size_t n, std::size_t k, std::size_t mb, std::size_t cnt);
  // Throws the error of a failed gTop-k exchange (engines/topk/tree.hpp).
  [[noreturn]] void fail_global(const sparse_message::unpack_result& F, const sparse_message::header& mark, const sparse_message::unpack_result& own,
                                int own_peer, std::size_t k, std::size_t off, std::size_t n) const;

  Ctx* cx_;
  bool fused_ = false;
  std::size_t kcap_ = 0;
  float scale_ = 1.0f;    // applied before encoding (1/P with a 16-bit wire and averaging)
  float unscale_ = 1.0f;  // its inverse, for residual bookkeeping
  buffer<float> residual_;
  typename B::template topk_scratch<W> ws_;
  buffer<std::uint8_t> send_msg_, recv_msg_, bcast_msg_, gather_;
  std::vector<std::uint64_t> selected_, exchanged_, marks_, marks_summary_;  // host memory only: see selected()
  buffer<float> decoded_;  // GTopK: the global list's values; TopK: the union's results (host scratch)
  std::vector<plan::tree_step> steps_;
  topk_lists<std::uint32_t, W, B> l32_;
  topk_lists<std::uint64_t, W, B> l64_;
  // per iteration
  std::size_t wire_bytes_ = 0, selected_n_ = 0, exchanged_n_ = 0, k_total_ = 0, selections_ = 0, message_bytes_ = 0;
  selection_paths paths_{};
};

}  // namespace gflow::detail
