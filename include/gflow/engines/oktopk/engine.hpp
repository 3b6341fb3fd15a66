#pragma once
// Include engines/oktopk.hpp, not this file: the exchange is defined in exchange.hpp.
//
// detail::oktopk_engine: the engine of Sparsifier<OkTopK<d>> (Ok-Topk: Li & Hoefler, PPoPP'22;
// what it does, its residual rule, its defaults and its limits are described with the tag in
// policies/oktopk.hpp). This file holds the class, its settings, its checkpoint and the local
// selection; the split-and-reduce and the balance-and-allgatherv are in exchange.hpp.
// Host memory only: the device path is not written yet (static_assert below).
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "../../kernels/topk.hpp"
#include "../../plan/density.hpp"
#include "../../support/checkpoint.hpp"
#include "../../support/oktopk_message.hpp"
#include "../../timeline.hpp"
#include "../../transport/transport.hpp"
#include "../concepts.hpp"
#include "../topk/state.hpp"

namespace gflow::detail {

/// OkTopK's run-time parameters (Sparsifier<OkTopK<d>>::set_params); the defaults are the
/// authors' code's (Shigangli/Ok-Topk, VGG/allreducer.py).
struct oktopk_params {
  std::uint64_t threshold_period = 32;  // exact local top-k and exact global top-k every this many iterations
  std::uint64_t boundary_period = 64;   // region boundaries re-estimated every this many iterations
  double local_adapt = 1.012;           // local threshold x / ÷ this when a selection leaves [2k/3, 5k/4]
  double global_adapt = 1.008;          // global threshold ÷ this when the result has < 2k/3 entries (> 4k/3: set to its k-th largest)
  double capacity = 2.0;                // a threshold selection keeps at most capacity * k entries (else exact top-k)
};

inline void check_oktopk_params(const oktopk_params& p) {
  auto bad = [](const char* what, const std::string& why, const char* fix) { throw invalid_argument(what, why, fix); };
  if (p.threshold_period == 0) bad("threshold_period", "the threshold re-estimation period is 0.", "pass a period >= 1 (1: exact top-k every iteration).");
  if (p.boundary_period == 0) bad("boundary_period", "the boundary re-estimation period is 0.", "pass a period >= 1 (1: boundaries every iteration).");
  if (!(p.local_adapt >= 1.0 && p.local_adapt <= 2.0))
    bad("local_adapt", fmt::format("the local threshold's adaptation factor {:f} is outside [1, 2].", p.local_adapt), "pass e.g. 1.012 (1: no adaptation).");
  if (!(p.global_adapt >= 1.0 && p.global_adapt <= 2.0))
    bad("global_adapt", fmt::format("the global threshold's adaptation factor {:f} is outside [1, 2].", p.global_adapt), "pass e.g. 1.008 (1: no adaptation).");
  if (!(p.capacity >= 1.0 && p.capacity <= 64.0))
    bad("capacity", fmt::format("the selection capacity {:f} x k is outside [1, 64].", p.capacity), "pass e.g. 2 (the default).");
}

template <class Ctx, double Density>
class oktopk_engine {
  using T = typename Ctx::transport_type;
  using W = typename Ctx::wire_type;
  using B = typename Ctx::backend;
  static_assert(!B::stream_ordered,
                "gflow::Sparsifier<OkTopK<d>> runs on host memory only (MPI, in-process, mock transports); its device path is not "
                "written yet. On GPUs use Sparsifier<GTopK<d>> or Sparsifier<TopK<d>>.");
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
    float global_thr = -1.0f;
    std::vector<std::uint64_t> bounds;
  };
  /// What this rank re-estimated this iteration (the passes the threshold path saves).
  struct reestimations {
    std::size_t local = 0;     // exact local top-k (period, first use, or a threshold selection over capacity)
    std::size_t boundary = 0;  // boundary re-estimations (one all_reduce of P - 1 offsets each)
    std::size_t global = 0;    // exact global top-k (every reduced entry all-gathered)
    std::size_t second_pass = 0;  // threshold selections so far over capacity that a full radix select ran after them
  };

  explicit oktopk_engine(Ctx& cx) : cx_(&cx), schedule_(plan::density_schedule::constant(Density)) {
    wide_ = cx.pool->total > (std::uint64_t{1} << 32);
    residual_.assign(cx.pool->total, 0.0f);
    replan();
  }

  // ---- the sparsifier engine interface ----------------------------------------------------
  void replan() {
    fused_ = cx_->fused();
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
    if (ws_.keys.size() < ncap) ws_.keys.assign(ncap, 0);  // the over-capacity fallback's scratch
    units_.assign(units, unit_state{});
    const float Pf = static_cast<float>(cx_->transport->size());
    scale_ = (Ctx::narrow && cx_->average) ? 1.0f / Pf : 1.0f;
    unscale_ = (Ctx::narrow && cx_->average) ? Pf : 1.0f;
  }

  void exchange(std::size_t b) {
    if (b == 0) begin_iteration();
    const auto& bk = (*cx_->buckets)[b];
    if (fused_) select_and_exchange(b, bk.offset, bk.count);
    else if (b + 1 == cx_->buckets->size()) select_and_exchange(0, 0, cx_->pool->total);
  }
  void end_iteration() {}

  /// Bytes this rank put on the wire this iteration, every round: in all_to_all(v) its blocks
  /// for the other ranks, in all_gather(v) its own block once per other rank (what a direct
  /// exchange sends; summed over ranks this equals a ring's traffic too), in the boundaries'
  /// all_reduce 2 (P-1)/P of the buffer (a ring's).
  [[nodiscard]] std::size_t wire_bytes() const noexcept { return wire_bytes_; }
  /// Transport calls this rank made this iteration.
  [[nodiscard]] std::size_t collectives() const noexcept { return collectives_; }

  // ---- run-time settings (between iterations; the same on every rank) ----------------------
  void set_density(double d) {
    plan::check_density(d);
    set_schedule(plan::density_schedule::constant(d));
  }
  void set_schedule(plan::density_schedule s) {
    schedule_ = std::move(s);
    replan();
  }
  [[nodiscard]] const plan::density_schedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] double density() const noexcept { return density_; }
  /// Periods, adaptation factors and capacity (validated: invalid_argument naming the field).
  /// Thresholds and boundaries already estimated are kept.
  void set_params(const oktopk_params& p) {
    check_oktopk_params(p);
    params_ = p;
  }
  [[nodiscard]] const oktopk_params& params() const noexcept { return params_; }
  void set_index_bytes(std::size_t bytes) {
    if (bytes != 4 && bytes != 8)
      throw invalid_argument("index_bytes", fmt::format("indices travel as 4 or 8 bytes (got {}).", bytes), "pass 4 or 8.");
    if (bytes == 4 && cx_->pool->total > (std::uint64_t{1} << 32))
      throw invalid_argument("index_bytes", fmt::format("the pool has {} elements; 32-bit indices address at most 2^32.", cx_->pool->total),
                             "keep 8-byte indices for this layout.");
    wide_ = bytes == 8;
  }
  [[nodiscard]] std::size_t index_bytes() const noexcept { return wide_ ? 8 : 4; }

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
    w.array(residual_.data(), residual_.size());
    w.u64(params_.threshold_period);
    w.u64(params_.boundary_period);
    w.f64(params_.local_adapt);
    w.f64(params_.global_adapt);
    w.f64(params_.capacity);
    w.u64(units_.size());
    for (const auto& u : units_) {
      w.f32(u.local_thr);
      w.f32(u.global_thr);
      w.array(u.bounds.data(), u.bounds.size());
    }
  }
  [[nodiscard]] saved_state read_state(checkpoint_reader& r) const;  // exchange.hpp
  void restore_state(saved_state&& s) {
    residual_ = std::move(s.residual);
    schedule_ = std::move(s.schedule);
    wide_ = s.wide;
    density_ = s.density;
    params_ = s.params;
    replan();
    units_ = std::move(s.units);
    begin_iteration();
  }

  // ---- introspection ------------------------------------------------------------------------
  [[nodiscard]] std::span<const float> residual() const noexcept { return residual_; }
  /// Pool indices this rank selected this iteration (increasing).
  [[nodiscard]] std::span<const std::uint64_t> selected() const noexcept { return selected_; }
  /// Pool indices the applied result holds a value for (increasing; identical on every rank).
  [[nodiscard]] std::span<const std::uint64_t> exchanged() const noexcept { return exchanged_; }
  /// k summed over this iteration's units (the target; selections and results vary around it).
  [[nodiscard]] std::size_t k() const noexcept { return k_total_; }
  [[nodiscard]] std::size_t selections() const noexcept { return selections_; }
  [[nodiscard]] const unit_state& unit(std::size_t u) const { return units_.at(u); }
  [[nodiscard]] std::size_t units() const noexcept { return units_.size(); }
  [[nodiscard]] reestimations reestimated() const noexcept { return reest_; }

 private:
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
  // above the local threshold (at most capacity * k). Exact top-k (accumulate_select_topk) when
  // the period says so and on first use. When the threshold selection runs over its capacity,
  // the exact top-k is taken among the candidates it gathered (up to 4 x capacity: every element
  // at or above the threshold is one, so the k largest are among them), without another pass;
  // only beyond that a full radix select of the G already stored (reestimations::second_pass).
  // Returns the count; the indices, increasing, are in idx_buf<I>().
  template <class I>
  std::size_t select(unit_state& us, std::size_t off, std::size_t n, std::size_t k) {
    std::vector<I>& idx = idx_buf<I>();
    const std::size_t cap = std::max<std::size_t>(k, static_cast<std::size_t>(std::ceil(params_.capacity * static_cast<double>(k))));
    const std::size_t ccap = 4 * cap;  // candidates gathered before a second pass is needed
    idx.resize(ccap);
    const float* g = cx_->grads + off;
    float* res = residual_.data() + off;
    bool exact = us.local_thr < 0.0f || due(params_.threshold_period);
    std::size_t cnt = 0;
    if (!exact) {
      const std::uint32_t tk = std::max<std::uint32_t>(kernels::magnitude_key(us.local_thr), 1u);  // zeros are never selected
      for (std::size_t i = 0; i < n; ++i) {
        const float v = g[i] + res[i];
        res[i] = v;
        if (kernels::magnitude_key(v) >= tk) {
          if (cnt < ccap) idx[cnt] = static_cast<I>(off + i);
          ++cnt;
        }
      }
      if (cnt > cap && cnt <= ccap) {  // the threshold is too low: the exact top-k among the candidates
        cand_keys_.resize(cnt);
        for (std::size_t j = 0; j < cnt; ++j) cand_keys_[j] = kernels::magnitude_key(residual_[static_cast<std::size_t>(idx[j])]);
        const kernels::threshold t = kernels::radix_threshold_keys(cand_keys_.data(), cnt, k, ws_.keys.data());
        std::size_t take = t.take, m = 0;
        for (std::size_t j = 0; j < cnt; ++j) {
          const std::uint32_t key = cand_keys_[j];
          if (key > t.key || (key == t.key && take > 0)) {
            if (key == t.key) --take;
            idx[m++] = idx[j];
          }
        }
        cnt = m;
        exact = true;
      } else if (cnt > ccap) {  // far too low: exact top-k of the G already in the residual
        cnt = kernels::select_topk(res, n, k, off, idx.data(), ws_.keys.data());
        ++reest_.second_pass;
        exact = true;
      }
    } else {
      cnt = cx_->kernels->accumulate_select_topk(g, res, n, k, off, idx.data(), ws_).count;
    }
    if (exact) {
      ++reest_.local;
      // The new threshold: the smallest |G| selected (finite and > 0; else estimate again next time).
      float t = std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < cnt; ++j) t = std::min(t, std::fabs(residual_[static_cast<std::size_t>(idx[j])]));
      us.local_thr = (cnt > 0 && std::isfinite(t) && t > 0.0f) ? t : -1.0f;
    } else {  // adapt (the authors' rule): fewer than 2k/3 selected lowers it, more than 5k/4 raises it
      const auto a = static_cast<float>(params_.local_adapt);
      if (3 * cnt < 2 * k) us.local_thr /= a;
      else if (4 * cnt > 5 * k) us.local_thr *= a;
    }
    return cnt;
  }

  template <class I>
  void run(std::size_t u, std::size_t off, std::size_t n);  // exchange.hpp

  template <class I>
  std::vector<I>& idx_buf() noexcept {
    if constexpr (std::same_as<I, std::uint32_t>) return idx32_;
    else return idx64_;
  }

  std::string fix_text() const {
    return "make every rank use the same layout, fusion, density schedule, OkTopK parameters and index width; otherwise the "
           "transport delivered corrupted bytes. This iteration's gradients were not exchanged; they stay in the residual.";
  }

  Ctx* cx_;
  plan::density_schedule schedule_;
  oktopk_params params_{};
  bool wide_ = false;
  bool fused_ = false;
  float scale_ = 1.0f, unscale_ = 1.0f;
  std::vector<float> residual_;
  kernels::topk_workspace ws_;
  std::vector<unit_state> units_;
  std::vector<std::uint32_t> idx32_;
  std::vector<std::uint64_t> idx64_;
  std::vector<std::uint32_t> cand_keys_;  // the over-capacity candidates' keys
  std::vector<std::uint64_t> selected_, exchanged_;
  // per-unit scratch (host; grown as needed, kept between iterations)
  std::vector<W> mine_val_;
  std::vector<float> decoded_;
  std::vector<std::uint8_t> send_buf_, recv_buf_;
  std::vector<std::pair<std::uint64_t, float>> red_;  // (index, value) received for this rank's region, then the sums
  double density_ = Density;
  std::size_t wire_bytes_ = 0, collectives_ = 0, k_total_ = 0, selections_ = 0;
  reestimations reest_{};
};

}  // namespace gflow::detail
