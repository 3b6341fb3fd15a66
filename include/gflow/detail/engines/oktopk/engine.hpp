#pragma once
// Include engines/oktopk.hpp, not this file: the exchange is defined in exchange.hpp.
//
// detail::oktopk_engine: the engine of Sparsifier<OkTopK<d>> (Ok-Topk: Li and Hoefler;
// what it does, its residual rule, its defaults and its limits are described with the tag in
// policies/oktopk.hpp). This file holds the class, its buffers, its checkpoint and
// the local selection (the density, schedule and index width: topk/settings.hpp, shared with
// TopK and GTopK; its parameters and their check: support/oktopk_params.hpp); the local selection
// and the buffers' sizes are defined in select.hpp, the split-and-reduce and the
// balance-and-allgatherv in exchange.hpp.
//
// Memory spaces: one engine over the backend (engines/concepts.hpp, oktopk_backend), like TopK's.
// The work over the pool (the accumulation and selection pass, the take, zeroing and writing the
// result, the residual updates) runs on the backend: host_backend's kernels::, or
// device_backend's CUDA twins on the transport's stream. The per-entry bookkeeping between them
// (region cuts, the split, the checks, the reduction by index, the global cut, the keep) is host
// code for both, on host copies of the lists: on device memory the selection's indices and keys
// and the taken values come down (about capacity x k entries), each collective's buffers go up to
// the transport and back through a staging buffer, and the result and the rounding errors go up.
// docs/DESIGN.md, "Device memory", lists these transfers.
//
// Sharded (Sharded = true: Sharding<ReduceScatter>, the scheme's sharded_engine): the split-and-
// reduce is the reduce-scatter. Every bucket is a selection unit (fused or not), its regions are
// the shard plan's blocks of it (fixed: no boundary estimate), and the sums of region `rank` are
// written into this rank's block of the pool (zero where no rank sent an entry; divided by P with
// an fp32 wire and averaging). No global cut and no all_gatherv: every entry sent is applied, so
// nothing goes back to a residual but what the selection did not take. The announcements'
// all_gather stays, carrying only fault marks, so that every rank raises the same error.
#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../../dtype.hpp"
#include "../../../error.hpp"
#include "../../kernels/topk.hpp"
#include "../../plan/density.hpp"
#include "../../support/checkpoint.hpp"
#include "../../support/oktopk_message.hpp"
#include "../../support/oktopk_params.hpp"
#include "../../../timeline.hpp"
#include "../../../transport/transport.hpp"
#include "../concepts.hpp"
#include "../sharded.hpp"
#include "../topk/settings.hpp"
#include "../topk/state.hpp"
#include "reduce.hpp"

namespace gflow::detail {

template <class Ctx, double Density, bool Sharded = false>
class oktopk_engine : public topk_settings<oktopk_engine<Ctx, Density, Sharded>> {
  using settings = topk_settings<oktopk_engine>;
  friend settings;
  using settings::schedule_;
  using settings::density_;
  using settings::wide_;
  using T = typename Ctx::transport_type;
  using W = typename Ctx::wire_type;
  using B = typename Ctx::backend;
  static_assert(oktopk_backend<B>,
                "gflow::Sparsifier<OkTopK<d>>: the memory space's backend has no OkTopK kernels "
                "(gflow::detail::oktopk_backend, include/gflow/detail/engines/concepts.hpp).");
  template <class E>
  using buffer = typename B::template buffer<E>;
  // Host memory: the backend reads the host lists themselves. Device memory: device copies.
  static constexpr bool on_host = !B::stream_ordered;
  static_assert(variable_transport<T>,
                "gflow::Sparsifier<OkTopK<d>> needs a transport with all_to_all, all_to_allv and all_gatherv "
                "(gflow::variable_transport, include/gflow/transport/transport.hpp).");

 public:
  static constexpr bool phased = false;
  static constexpr bool independent_buckets = false;

  /// Per selection unit: the thresholds (< 0: not estimated yet) and the region boundaries
  /// (P + 1 offsets from the unit's start; empty: not estimated yet).
  struct unit_state {
    float local_thr = -1.0f;
    float global_thr = -1.0f;  // the global cut's last level, as its smallest value (centres the next window)
    std::vector<std::uint64_t> bounds;
  };
  /// What this rank re-estimated this iteration (the passes the threshold path saves).
  struct reestimations {
    std::size_t local = 0;     // exact local top-k (period, first use, or a threshold selection over capacity)
    std::size_t boundary = 0;  // boundary re-estimations (one all_reduce of P - 1 offsets each)
    std::size_t global = 0;    // full-range searches of the global cut (first use, or the window missed: two all_reduces instead of one)
    std::size_t second_pass = 0;  // threshold selections (over 4 x capacity, or under k/2) that a full radix select ran after
  };

  explicit oktopk_engine(Ctx& cx) : settings(Density, cx.pool->total), cx_(&cx) {
    residual_ = buffer<float>(cx.pool->total);  // zero-filled
    replan();
  }

  // ---- the sparsifier engine interface ----------------------------------------------------
  void replan() {
    fused_ = Sharded || cx_->fused();  // sharded: one unit per bucket, as the shards are cut
    const double dmax = schedule_.max();
    ws_.release();
    std::size_t units = 0, ncap = 0;
    auto unit = [&](std::size_t n) {
      ws_.reserve(n, plan::k_for(dmax, n));
      ncap = std::max(ncap, n);
      ++units;
    };
    if (fused_) {
      for (const auto& b : *cx_->buckets) unit(b.count);
    } else {
      unit(cx_->pool->total);
    }
    const int P = cx_->transport->size();
    units_.assign(units, unit_state{});
    for (auto& us : units_) us.bounds.reserve(static_cast<std::size_t>(P) + 1);
    const float Pf = static_cast<float>(P);
    scale_ = (Ctx::narrow && cx_->average) ? 1.0f / Pf : 1.0f;
    unscale_ = (Ctx::narrow && cx_->average) ? Pf : 1.0f;
    size_buffers();
    if constexpr (Sharded && Ctx::narrow) gather_wire_ = buffer<W>(cx_->pool->total);
  }

  void exchange(std::size_t b) {
    if (b == 0) begin_iteration();
    const auto& bk = (*cx_->buckets)[b];
    if (fused_) select_and_exchange(b, bk.offset, bk.count);
    else if (b + 1 == cx_->buckets->size()) select_and_exchange(0, 0, cx_->pool->total);
  }
  void end_iteration() {}
  /// Sharded: ex.gather_shards(values), the parameters' all-gather (dense, as Sparsifier<None>'s).
  void gather(float* values)
    requires Sharded
  {
    gather_shards_through(*cx_, gather_wire_, values);
  }

  /// Bytes this rank put on the wire this iteration, every round: in all_to_all(v) its blocks
  /// for the other ranks, in all_gather(v) its own block once per other rank (what a direct
  /// exchange sends; summed over ranks this equals a ring's traffic too), in the boundaries'
  /// all_reduce 2 (P-1)/P of the buffer (a ring's).
  [[nodiscard]] std::size_t wire_bytes() const noexcept { return wire_bytes_; }
  /// Transport calls this rank made this iteration.
  [[nodiscard]] std::size_t collectives() const noexcept { return collectives_; }

  // Run-time settings: set_density, set_schedule (replans: thresholds and boundaries are estimated
  // again), schedule(), density(), set_index_bytes (thresholds and boundaries kept), index_bytes()
  // (topk_settings, engines/topk/settings.hpp).
  /// Periods, adaptation factors and capacity (validated: invalid_argument naming the field).
  /// Thresholds and boundaries already estimated are kept.
  void set_params(const oktopk_params& p) {
    check_oktopk_params(p);
    params_ = p;
    size_buffers();  // a larger capacity: larger bounds
  }
  [[nodiscard]] const oktopk_params& params() const noexcept { return params_; }

  // ---- checkpoint ---------------------------------------------------------------------------
  // Format (after the exchanger's header): u32 index bytes, f64 density, the schedule (u64 steps,
  // (u64 until, f64 density) each, f64 final), the residual array (as TopK's), then OkTopK's own:
  // the parameters (u64, u64, f64, f64, f64), u64 units, per unit f32 local threshold,
  // f32 global threshold, the boundaries array (0 or P + 1 u64). support/reshard.hpp
  // (read_oktopk_tail) reads this tail without an engine and must change with it.
  struct saved_state {
    std::vector<float> residual;
    plan::density_schedule schedule = plan::density_schedule::constant(Density);
    bool wide = false;
    double density = Density;
    oktopk_params params{};
    std::vector<unit_state> units;
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
    write_oktopk_params(w, params_);
    w.u64(units_.size());
    for (const auto& u : units_) {
      w.f32(u.local_thr);
      w.f32(u.global_thr);
      w.array(u.bounds.data(), u.bounds.size());
    }
  }
  [[nodiscard]] saved_state read_state(checkpoint_reader& r) const;  // exchange.hpp
  void restore_state(saved_state&& s) {
    cx_->kernels->upload(residual_.data(), s.residual.data(), s.residual.size());
    schedule_ = std::move(s.schedule);
    wide_ = s.wide;
    density_ = s.density;
    params_ = s.params;
    replan();
    units_ = std::move(s.units);
    const std::size_t P1 = static_cast<std::size_t>(cx_->transport->size()) + 1;
    for (auto& us : units_) us.bounds.reserve(P1);  // a unit saved before its first estimate: no allocation when it comes
    begin_iteration();
  }

  // ---- introspection ------------------------------------------------------------------------
  /// The residual, in pool order, in the backend's memory (device memory: a device span).
  [[nodiscard]] std::span<const float> residual() const noexcept { return {residual_.data(), residual_.size()}; }
  /// Pool indices this rank selected this iteration (increasing). Both memory spaces: the
  /// per-entry bookkeeping runs on the host.
  [[nodiscard]] std::span<const std::uint64_t> selected() const noexcept { return selected_; }
  /// Pool indices the applied result holds a value for (increasing; identical on every rank;
  /// sharded: those of this rank's shard).
  [[nodiscard]] std::span<const std::uint64_t> exchanged() const noexcept { return exchanged_; }
  /// k summed over this iteration's units (the target; selections and results vary around it).
  [[nodiscard]] std::size_t k() const noexcept { return k_total_; }
  [[nodiscard]] std::size_t selections() const noexcept { return selections_; }
  [[nodiscard]] const unit_state& unit(std::size_t u) const { return units_.at(u); }
  [[nodiscard]] std::size_t units() const noexcept { return units_.size(); }
  [[nodiscard]] reestimations reestimated() const noexcept { return reest_; }

 private:
  /// The index-typed buffers of one index width: host lists, and (device memory only) the
  /// device copies the pool kernels read.
  template <class I>
  struct index_lists {
    std::vector<I> sel;     // this rank's selection (room for the threshold path's candidates)
    std::vector<I> recv;    // the entries received for this rank's region, peer after peer
    std::vector<I> kept;    // this rank's reduced entries that it all-gathers
    std::vector<I> result;  // the applied entries (F), every region in rank order
    std::vector<I> fix;     // the applied kept entries whose re-encoding rounded (their residuals get the error)
    buffer<I> dsel, dresult, dfix;  // device memory: copies of sel, result, fix
    void reserve(std::size_t ncand, std::size_t nrecv, std::size_t nres) {
      sel.reserve(ncand);
      recv.reserve(nrecv);
      kept.reserve(nres);
      result.reserve(nres);
      fix.reserve(nres);
      if constexpr (!on_host) {
        grow(dsel, ncand);
        grow(dresult, nres);
        grow(dfix, nres);
      }
    }
  };
  template <class E>
  static void grow(buffer<E>& b, std::size_t n) {
    if (b.size() < n) b = buffer<E>(n);
  }

  // Where the pool kernels read a host list: the list itself on host memory, its device copy
  // (filled by to_space) on device memory.
  template <class E>
  static E* space(std::vector<E>& h, buffer<E>& d) noexcept {
    if constexpr (on_host) return h.data();
    else return d.data();
  }
  template <class E>
  void to_space(buffer<E>& d, const std::vector<E>& h, std::size_t n) {
    if constexpr (!on_host) cx_->kernels->upload(d.data(), h.data(), n);
  }
  template <class E>
  void from_space(std::vector<E>& h, const buffer<E>& d, std::size_t n) {
    if constexpr (!on_host) cx_->kernels->download(h.data(), d.data(), n);
  }

  // A collective over host lists: on host memory the transport takes them as they are; on device
  // memory the send side goes up to stage_, the collective runs there, the receive side comes
  // back. call(send, recv) issues it on the pointers it is given.
  template <class E, class Call>
  void staged(const E* send, std::size_t ns, E* recv, std::size_t nr, Call&& call) {
    if constexpr (on_host) {
      call(send, recv);
    } else {
      const std::size_t at = (ns * sizeof(E) + 255) / 256 * 256;  // the receive side, aligned
      grow(stage_, at + nr * sizeof(E));
      E* ds = reinterpret_cast<E*>(stage_.data());
      E* dr = reinterpret_cast<E*>(stage_.data() + at);
      cx_->kernels->upload(ds, send, ns);
      call(static_cast<const E*>(ds), dr);
      cx_->kernels->download(recv, dr, nr);
    }
  }
  template <class E, class Call>
  void staged_in_place(E* buf, std::size_t n, Call&& call) {
    if constexpr (on_host) {
      call(buf);
    } else {
      grow(stage_, n * sizeof(E));
      E* d = reinterpret_cast<E*>(stage_.data());
      cx_->kernels->upload(d, buf, n);
      call(d);
      cx_->kernels->download(buf, d, n);
    }
  }

  void begin_iteration() {
    density_ = schedule_.at(*cx_->iteration);
    wire_bytes_ = collectives_ = k_total_ = selections_ = 0;
    selected_.clear();
    exchanged_.clear();
    reest_ = {};
  }
  void select_and_exchange(std::size_t u, std::size_t off, std::size_t n) {
    if (wide_) run<std::uint64_t>(u, off, n);
    else run<std::uint32_t>(u, off, n);
  }
  [[nodiscard]] bool due(std::uint64_t period) const noexcept { return *cx_->iteration % period == 0; }

  // Local selection, one pass: G = g + residual into the residual, and the indices of |G| at or
  // above the local threshold (at most capacity * k; backend accumulate_gather_above, on the host
  // the sampled top-k's AVX2 gathering pass). Exact top-k (accumulate_select_topk) when the
  // period says so and on first use. When the threshold selection runs over its capacity, the
  // exact top-k is taken among the candidates it gathered (up to 4 x capacity: every element at or
  // above the threshold is one, so the k largest are among them), without another pass; only
  // beyond that, or when it gathered fewer than k/2 (the gradients shrank under a threshold that
  // the adaptation would take hundreds of iterations to bring down), a full radix select of the
  // G already stored (reestimations::second_pass).
  // Returns the count; the indices, increasing, are in lists<I>().sel (host) and, on device
  // memory, in lists<I>().dsel; on exact selections their keys (|G| bits) in sel_keys_.
  template <class I>
  std::size_t select(unit_state& us, std::size_t off, std::size_t n, std::size_t k);  // select.hpp

  template <class I>
  void run(std::size_t u, std::size_t off, std::size_t n);  // exchange.hpp
  template <class I>
  void write_shard(std::size_t u);  // exchange.hpp (Sharded only)

  /// The most a threshold selection of k keeps (capacity x k, at least k).
  [[nodiscard]] std::size_t cap_for(std::size_t k) const noexcept {
    return std::max<std::size_t>(k, static_cast<std::size_t>(std::ceil(params_.capacity * static_cast<double>(k))));
  }

  // Every buffer an iteration uses, reserved for the bounds the checks enforce, so that an
  // iteration allocates nothing (tests/engines/test_oktopk.cpp counts): per unit of n elements,
  // with k for the schedule's largest density and c = cap_for(k), a selection holds at most
  // 4c candidates and c entries; a rank receives at most c entries from each peer for its region
  // (check_count), so at most P c, summed into at most min(P c, n); the result is the union of
  // every rank's selection, at most min(P c, n) entries (a corrupt peer's larger block, still
  // checked against the region's size, grows the buffers once). Only grows. On device memory
  // the device copies and the staging buffer are sized here too.
  void size_buffers();  // select.hpp
  void index_width_changed() { size_buffers(); }

  template <class I>
  index_lists<I>& lists() noexcept {
    if constexpr (std::same_as<I, std::uint32_t>) return l32_;
    else return l64_;
  }

  std::string fix_text() const {
    return "make every rank use the same layout, fusion, density schedule, OkTopK parameters and index width; otherwise the "
           "transport delivered corrupted bytes. This iteration's gradients were not exchanged; they stay in the residual.";
  }

  Ctx* cx_;
  oktopk_params params_{};
  bool fused_ = false;
  float scale_ = 1.0f, unscale_ = 1.0f;
  buffer<float> residual_;
  typename B::template topk_scratch<W> ws_;
  std::vector<unit_state> units_;
  std::vector<std::uint64_t> cand_pos_;   // the threshold pass's candidates (pool positions) ...
  std::vector<std::uint32_t> cand_keys_;  // ... and their keys
  std::vector<std::uint32_t> sel_keys_;   // the selection's keys (|G| bits): the local threshold's estimate
  std::vector<std::uint32_t> hkeys_;      // host radix scratch: the candidates'
  std::vector<float> fix_err_;            // the rounding errors added to the residual at lists<I>().fix
  // device memory only (empty on host memory): copies of the lists above, and the collectives' staging
  buffer<std::uint64_t> dcand_pos_;
  buffer<std::uint32_t> dcand_keys_, dsel_keys_;
  buffer<W> dmine_, dresult_val_;
  buffer<float> dfix_err_;
  buffer<float> dred_val_;  // sharded: the region's sums as written into the shard
  buffer<W> gather_wire_;   // sharded with a 16-bit wire: gather_shards' wire copy of the pool
  buffer<std::uint8_t> stage_;
  std::vector<std::uint64_t> selected_, exchanged_;
  // per-unit scratch (host; sized by size_buffers, kept between iterations)
  index_lists<std::uint32_t> l32_;  // only the index width in use is sized
  index_lists<std::uint64_t> l64_;
  std::vector<W> mine_val_, recv_val_, kept_val_, result_val_;  // the values of sel, recv, kept, result
  std::vector<float> kept_err_;  // each kept entry's rounding in the wire type
  std::vector<std::pair<std::uint64_t, float>> red_;  // the sums of this rank's region, by index
  std::vector<float> decoded_;
  std::vector<std::uint32_t> red_keys_;    // the keys (|sum| bits) of red_, for the global cut
  std::vector<std::uint32_t> level_keys_;  // the keys of red_ at the cut's level (this rank's share is its largest)
  std::vector<std::uint8_t> send_buf_, recv_buf_;
  std::vector<std::uint64_t> cuts_;  // the boundary proposals (P - 1)
  std::vector<std::size_t> pos_, from_;  // per peer: where its entries start in sel / recv (P + 1)
  std::vector<std::uint64_t> sc_n_, rc_n_;     // per peer: entries sent / received
  std::vector<std::size_t> sbytes_, rbytes_, gbytes_;  // per peer: bytes sent / received in all_to_allv, received in all_gatherv
  std::vector<oktopk_message::announcement> anns_;  // every rank's all-gathered announcement
  std::vector<std::uint64_t> gcount_;           // per rank: entries in its result block
  region_reduce_scratch rr_;  // the region reduction's radix sort (reduce.hpp)
  std::size_t wire_bytes_ = 0, collectives_ = 0, k_total_ = 0, selections_ = 0;
  reestimations reest_{};
};

}  // namespace gflow::detail
