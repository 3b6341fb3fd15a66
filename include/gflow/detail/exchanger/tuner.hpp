#pragma once
// The fusion auto-tuner behind Fusion<Auto> (docs/DESIGN.md, "Auto-tuner").
//
//   using Exchange = gflow::Exchanger<gflow::Fusion<gflow::Auto>, gflow::Overlap<gflow::Funneled>>;
//
// After every finish() the exchanger hands the tuner this rank's measurements of the iteration:
// when each tensor became ready (since the iteration's first ready()), how long each bucket's
// exchange took, and the iteration's time. The tuner
//   1. probes: runs a few fixed thresholds (the initial one, 64 KiB, 256 KiB, 1 MiB, 16 MiB)
//      round-robin, one iteration per visit, for 3 rounds, collecting (bucket bytes, seconds) and
//      the ready times; each probe is scored paired, by the median over the rounds of its time
//      over that round's mean (a slow stretch of the machine lands on a whole round);
//   2. fits alpha + beta * bytes to the bucket times (plan/cost_model.hpp) and picks the
//      threshold (2^16 ... 2^28 bytes) and first bucket that minimise the modelled completion of
//      the iteration: buckets launch when the ready prefix covers them and run one after another
//      on the issuing thread, so bucket b ends at max(launch_b, end_{b-1}) + alpha + beta * bytes_b;
//   3. verifies (successive halving): the 3 best-scored probes and the model's choice run 5 more
//      rounds and the best paired score wins (the model cannot see e.g. a bucket falling out of
//      the cache; a probe's few raw medians let noise pick a plan 11-36% slower);
//   With Topology<Hybrid<switch, g>> it also tunes the switch (messages below it go hierarchical,
//   the others ring): the probes then run the fusion probes with every bucket on the ring and
//   three of them with every bucket hierarchical, one line is fitted to each, and the model
//   chooses among "all ring", "all hierarchical" and the size where the hierarchical line crosses
//   the ring line (Hybrid can only send the small messages hierarchically);
//   4. settles, and watches: each rank keeps its own window of `window` iterations (no collective
//      in between); at its end the window's medians of the iteration time and of the backward's
//      span are reduced (max). The first window gives the reference; when two windows in a row
//      move by more than `drift` from it, it probes again.
// Identical on every rank by construction: the measurements are first reduced (max) over the
// ranks, so every rank runs the same state machine on the same numbers, and the plan to use next
// is then broadcast from rank 0 and applied by every rank (Horovod #1282 desynchronised buckets
// with per-rank decisions). The exchanger applies it between iterations (set_fusion).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../error.hpp"
#include "../../layout.hpp"
#include "../plan/buckets.hpp"
#include "../plan/cost_model.hpp"
#include "../plan/fusion_model.hpp"
#include "../plan/pool.hpp"
#include "../../transport/transport.hpp"

namespace gflow::detail {

struct tuner_settings {
  // besides the initial threshold; factor-4 steps over the range where this machine's sweeps found the best
  std::vector<std::size_t> probes{std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  // Topology<Hybrid> only: the fusion thresholds probed again with every bucket hierarchical (the
  // probes above then run with every bucket on the ring)
  std::vector<std::size_t> hierarchical_probes{std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  // Rounds over every probe, then over the `contenders` best-scored probes plus the model's
  // choice: 3 + 5 rounds settle in 30-35 iterations (the 8 plans of a Hybrid tuner: 39-44).
  int probe_rounds = 3;
  int final_rounds = 5;
  std::size_t contenders = 3;
  int window = 10;              // settled: iterations per drift check
  double drift = 0.2;           // relative change that triggers a new probe
  std::size_t min_threshold = std::size_t{64} << 10;
  std::size_t max_threshold = std::size_t{256} << 20;
};

class fusion_tuner {
 public:
  enum class phase : std::uint32_t { probe = 0, verify = 1, settled = 2 };

  /// `hybrid_switch`: the composition's Topology<Hybrid> switch to start from (0: no Hybrid).
  fusion_tuner(const Layout& layout, const plan::pool_plan& pool, std::size_t wire_bytes, std::size_t initial, tuner_settings s = {},
               std::size_t hybrid_switch = 0)
      : layout_(&layout), pool_(&pool), wire_(wire_bytes), s_(std::move(s)), hybrid_(hybrid_switch != 0) {
    if (s_.probe_rounds < 1 || s_.final_rounds < 1 || s_.contenders < 1 || s_.window < 1 || !(s_.drift > 0) || s_.min_threshold == 0 ||
        s_.max_threshold < s_.min_threshold)
      throw invalid_argument("tuner_settings",
                             "probe_rounds, final_rounds, contenders and window must be >= 1, drift > 0 and 0 < min_threshold <= max_threshold.",
                             "keep the defaults or pass positive numbers.");
    auto add = [&](fusion_plan p) {
      if (p.threshold > 0 && std::find(probes_.begin(), probes_.end(), p) == probes_.end()) probes_.push_back(p);
    };
    add({initial, 0, hybrid_switch});
    for (std::size_t p : s_.probes) add({p, 0, hybrid_ ? fusion_plan::all_ring : 0});
    if (hybrid_)
      for (std::size_t p : s_.hierarchical_probes) add({p, 0, fusion_plan::all_hierarchical});
    restart();
  }

  /// The plan the next iteration should use.
  [[nodiscard]] fusion_plan current() const noexcept { return current_; }
  [[nodiscard]] phase state() const noexcept { return phase_; }
  /// The fitted bucket cost (with Topology<Hybrid>: of the ring; fitted_hierarchical() is the other line).
  [[nodiscard]] const plan::alpha_beta& fitted() const noexcept { return fit_; }
  [[nodiscard]] const plan::alpha_beta& fitted_hierarchical() const noexcept { return fit_hier_; }
  [[nodiscard]] bool tunes_hybrid_switch() const noexcept { return hybrid_; }
  [[nodiscard]] std::uint64_t retunes() const noexcept { return retunes_; }
  /// The last probe phase, for reports: each probed plan with its iteration times (the slowest
  /// rank's, in visiting order) and paired score, the plan the model chose, and the final rounds'
  /// contenders with their paired scores (1 = the round's mean; the lowest settles).
  [[nodiscard]] std::span<const fusion_plan> probed_plans() const noexcept { return probes_; }
  [[nodiscard]] std::span<const std::vector<double>> probe_times() const noexcept { return probe_times_; }
  [[nodiscard]] std::span<const double> probe_scores() const noexcept { return probe_scores_; }
  [[nodiscard]] fusion_plan model_choice() const noexcept { return model_choice_; }
  [[nodiscard]] std::span<const fusion_plan> final_plans() const noexcept { return finals_; }
  [[nodiscard]] std::span<const double> final_scores() const noexcept { return final_scores_; }
  /// Iterations observed since the last (re)start of probing.
  [[nodiscard]] std::uint64_t iterations_in_phase() const noexcept { return seen_; }

  /// Feeds one iteration measured under current(); collective over t (every rank, after every
  /// finish()): while probing or verifying one all_reduce and one broadcast per iteration, once
  /// settled one of each per `window` iterations and none in between. Returns the plan for the
  /// next iteration: the same on every rank (rank 0's).
  template <class T>
  fusion_plan step(T& t, const tuner_sample& mine, std::size_t bucket_count) {
    const std::size_t n = layout_->size();
    if (mine.ready_s.size() != n || mine.bucket_s.size() != bucket_count)
      throw invalid_argument("sample", fmt::format("the tuner got {} ready times and "
                                           "{} bucket times; the plan has {}"
                                           " tensors and {} buckets.", mine.ready_s.size(), mine.bucket_s.size(), n, bucket_count),
                             "pass one ready time per tensor and one time per bucket of the plan in use.");
    if (phase_ == phase::settled) {
      // Settled: no collective until a window is full. Each rank keeps its own window; at its end
      // the two medians are reduced (max) and the drift check runs on those, identical everywhere.
      ++seen_;
      double m[2];
      if (!add_to_window(mine.iteration_s, span_of(mine.ready_s), m)) return current_;
      t.all_reduce(m, 2, reduce_op::max);
      settled_window(m[0], m[1]);
    } else {
      // 1. the slowest rank's view, identical everywhere
      packed_.clear();
      packed_.push_back(mine.iteration_s);
      packed_.push_back(span_of(mine.ready_s));
      packed_.insert(packed_.end(), mine.ready_s.begin(), mine.ready_s.end());
      packed_.insert(packed_.end(), mine.bucket_s.begin(), mine.bucket_s.end());
      t.all_reduce(packed_.data(), packed_.size(), reduce_op::max);
      // 2. the state machine, on the reduced numbers
      observe(std::span<const double>(packed_), bucket_count);
    }
    // 3. rank 0's plan for everyone
    std::uint64_t d[4] = {current_.threshold, current_.first, current_.hybrid_switch, static_cast<std::uint64_t>(phase_)};
    t.broadcast(d, 4, 0);
    current_ = {static_cast<std::size_t>(d[0]), static_cast<std::size_t>(d[1]), static_cast<std::size_t>(d[2])};
    phase_ = static_cast<phase>(d[3]);
    return current_;
  }

  /// The deterministic core (also what tests drive): `reduced` = [iteration_s, backward span,
  /// then in probe/verify the ready times and the bucket times].
  void observe(std::span<const double> reduced, std::size_t bucket_count) {
    const std::size_t n = layout_->size();
    const double it_s = reduced[0], span_s = reduced[1];
    ++seen_;
    if (phase_ == phase::settled) {
      double m[2];
      if (add_to_window(it_s, span_s, m)) settled_window(m[0], m[1]);
      return;
    }
    // probe / verify: keep the ready times and the bucket samples
    const auto ready = reduced.subspan(2, n);
    const auto bucket = reduced.subspan(2 + n, bucket_count);
    if (ready_sum_.empty()) ready_sum_.assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) ready_sum_[i] += ready[i];
    ++ready_count_;
    const auto plan_b = plan::plan_buckets(*layout_, *pool_, {wire_, current_.threshold, current_.first});
    for (std::size_t b = 0; b < bucket_count && b < plan_b.size(); ++b) {
      if (bucket[b] > 0) {
        const std::size_t bytes = plan_b[b].count * wire_;
        const bool hier = hybrid_ && bytes < current_.hybrid_switch;  // as hybrid_engine routes it
        (hier ? hier_bytes_ : sample_bytes_).push_back(static_cast<double>(bytes));
        (hier ? hier_s_ : sample_s_).push_back(bucket[b]);
      }
    }
    spans_.push_back(span_s);
    // probe and verify: rounds over the phase's plans, one iteration per visit, so that a drift of
    // the machine lands on every plan alike (a plan's iterations in one stretch let a slow stretch
    // decide the choice)
    const bool probing = phase_ == phase::probe;
    auto& plans = probing ? probes_ : finals_;
    auto& times = probing ? probe_times_ : final_times_;
    times[probe_index_].push_back(it_s);
    if (++probe_index_ == plans.size()) probe_index_ = 0;
    current_ = plans[probe_index_];
    if (probe_index_ != 0 || times[0].size() < static_cast<std::size_t>(s_.probe_rounds + (probing ? 0 : s_.final_rounds))) return;
    const auto scores = paired_scores(times);
    std::vector<std::size_t> order(plans.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
    best_probe_ = plans[order[0]];
    best_measured_ = scores[order[0]];
    (probing ? probe_scores_ : final_scores_) = scores;
    if (!probing) {
      settle(best_probe_, best_measured_);
      return;
    }
    // every probe measured: fit, model, and the final rounds among the best probes and the model's choice
    fit_ = sample_s_.empty() ? plan::alpha_beta{} : plan::fit_alpha_beta(sample_bytes_, sample_s_);
    fit_hier_ = hier_s_.empty() ? plan::alpha_beta{} : plan::fit_alpha_beta(hier_bytes_, hier_s_);
    std::vector<double> ready_mean(n);
    for (std::size_t i = 0; i < n; ++i) ready_mean[i] = ready_sum_[i] / static_cast<double>(ready_count_);
    model_choice_ = best_model_plan(ready_mean);
    // the probes' rounds count for the probes among them (NaN: the model's choice did not run then)
    finals_.clear();
    final_times_.clear();
    for (std::size_t k = 0; k < order.size() && k < s_.contenders; ++k) {
      finals_.push_back(probes_[order[k]]);
      final_times_.push_back(probe_times_[order[k]]);
    }
    if (std::find(finals_.begin(), finals_.end(), model_choice_) == finals_.end()) {
      finals_.push_back(model_choice_);
      final_times_.emplace_back(static_cast<std::size_t>(s_.probe_rounds), std::nan(""));
    }
    if (finals_.size() == 1) {
      final_scores_.assign(1, 1.0);
      settle(finals_[0], best_measured_);
      return;
    }
    final_scores_.clear();
    phase_ = phase::verify;
    current_ = finals_[0];
  }

  /// Each plan's paired score over rounds: the median over the rounds of its time over the mean
  /// of that round's times (round k: every plan's k-th time; NaN: the plan did not run in it).
  [[nodiscard]] static std::vector<double> paired_scores(const std::vector<std::vector<double>>& times) {
    std::vector<double> out(times.size(), 0.0), round;
    std::vector<std::vector<double>> per(times.size());
    for (std::size_t k = 0; k < times[0].size(); ++k) {
      round.clear();
      for (const auto& t : times)
        if (!std::isnan(t[k])) round.push_back(t[k]);
      double m = 0;  // the round's mean (its median made the middle plan of every round score exactly 1)
      for (double v : round) m += v / static_cast<double>(round.size());
      for (std::size_t i = 0; i < times.size(); ++i)
        if (!std::isnan(times[i][k])) per[i].push_back(m > 0 ? times[i][k] / m : 1.0);
    }
    for (std::size_t i = 0; i < times.size(); ++i) out[i] = per[i].empty() ? 1.0 : median(per[i]);
    return out;
  }

  /// Settled: one window's medians of the iteration time and of the backward's span. The first
  /// window gives the reference (a median of `window`, not of a probe's few); two windows in a
  /// row that moved by more than `drift` start a new probe.
  void settled_window(double iteration_s, double span_s) {
    if (ref_iteration_ <= 0) {
      ref_iteration_ = iteration_s;
      ref_span_ = span_s;
      return;
    }
    const bool moved = std::abs(iteration_s - ref_iteration_) > s_.drift * ref_iteration_ ||
                       (ref_span_ > 0 && std::abs(span_s - ref_span_) > s_.drift * ref_span_);
    // Two windows in a row: one slow stretch of a shared machine is not a drift (a single moved
    // window re-tuned 6 of 36 settled runs of bench/run overlap --autotune on 2 shared cores).
    if (moved && drift_seen_) {
      ++retunes_;
      restart();
      return;
    }
    drift_seen_ = moved;
  }

  /// The plan among the candidates that minimises the modelled completion.
  [[nodiscard]] fusion_plan best_model_plan(std::span<const double> ready_s) const {
    fusion_plan best{};
    double best_t = 0;
    const auto switches = candidate_switches();
    for (std::size_t th = s_.min_threshold; th <= s_.max_threshold; th *= 2) {
      for (std::size_t first : {std::size_t{0}, th / 8, th / 4}) {
        if (first != 0 && first < s_.min_threshold / 4) continue;
        const auto b = plan::plan_buckets(*layout_, *pool_, {wire_, th, first});
        for (std::size_t sw : switches) {
          const double t = modelled_completion_by(*pool_, b, ready_s, wire_, [&](double bytes) {
            return (hybrid_ && bytes < static_cast<double>(sw) ? fit_hier_ : fit_).time(bytes);
          });
          if (best.threshold == 0 || t < best_t * (1 - 1e-9)) {
            best = {th, first, sw};
            best_t = t;
          }
        }
      }
    }
    return best;
  }

  /// Without Hybrid: {0}. With it: every bucket on the ring, every bucket hierarchical, and, when
  /// the hierarchical line is below the ring's for small messages only, the size where they cross.
  [[nodiscard]] std::vector<std::size_t> candidate_switches() const {
    if (!hybrid_) return {0};
    std::vector<std::size_t> out{fusion_plan::all_ring, fusion_plan::all_hierarchical};
    if (fit_hier_.alpha < fit_.alpha && fit_hier_.beta > fit_.beta) {
      const double x = std::ceil((fit_.alpha - fit_hier_.alpha) / (fit_hier_.beta - fit_.beta));
      if (x > 1 && x < 0x1p62) out.insert(out.begin() + 1, static_cast<std::size_t>(x));
    }
    return out;
  }

  // ---- checkpoints: everything the decisions depend on ----------------------------------------
  template <class Writer>
  void save_state(Writer& w) const {
    w.u64(current_.threshold);
    w.u64(current_.first);
    w.u64(current_.hybrid_switch);
    w.u32(static_cast<std::uint32_t>(phase_));
    w.u64(probe_index_);
    w.u64(best_probe_.threshold);
    w.u64(best_probe_.first);
    w.u64(best_probe_.hybrid_switch);
    w.f64(best_measured_);
    w.f64(fit_.alpha);
    w.f64(fit_.beta);
    w.f64(fit_hier_.alpha);
    w.f64(fit_hier_.beta);
    w.f64(ref_iteration_);
    w.f64(ref_span_);
    w.u64(retunes_);
    w.u64(seen_);
  }
  struct saved_state {
    fusion_plan current, best_probe;
    phase ph;
    std::uint64_t probe_index, retunes, seen;
    double best_measured, alpha, beta, hier_alpha, hier_beta, ref_iteration, ref_span;
  };
  template <class Reader>
  [[nodiscard]] saved_state read_state(Reader& r) const {
    saved_state s{};
    s.current.threshold = static_cast<std::size_t>(r.u64("tuner threshold"));
    s.current.first = static_cast<std::size_t>(r.u64("tuner first bucket"));
    s.current.hybrid_switch = static_cast<std::size_t>(r.u64("tuner hybrid switch"));
    const std::uint32_t ph = r.u32("tuner phase");
    if (ph > 2) throw parse_error("tuner phase", fmt::format("the checkpoint's tuner phase is {} (0-2 expected).", ph), "load an unmodified checkpoint.");
    s.ph = static_cast<phase>(ph);
    s.probe_index = r.u64("tuner probe");
    s.best_probe.threshold = static_cast<std::size_t>(r.u64("tuner best probe"));
    s.best_probe.first = static_cast<std::size_t>(r.u64("tuner best probe first"));
    s.best_probe.hybrid_switch = static_cast<std::size_t>(r.u64("tuner best probe hybrid switch"));
    s.best_measured = r.f64("tuner best time");
    s.alpha = r.f64("tuner alpha");
    s.beta = r.f64("tuner beta");
    s.hier_alpha = r.f64("tuner hierarchical alpha");
    s.hier_beta = r.f64("tuner hierarchical beta");
    s.ref_iteration = r.f64("tuner reference iteration");
    s.ref_span = r.f64("tuner reference span");
    s.retunes = r.u64("tuner retunes");
    s.seen = r.u64("tuner iterations");
    if (s.current.threshold == 0)
      throw parse_error("tuner threshold", "the checkpoint's tuned threshold is 0.", "load an unmodified checkpoint.");
    if ((s.current.hybrid_switch != 0) != hybrid_)
      throw parse_error("tuner hybrid switch", std::string("the checkpoint's tuner ") + (hybrid_ ? "has no" : "has a") +
                                                   " Hybrid switch; this exchanger's composition " + (hybrid_ ? "has" : "has no") + " Topology<Hybrid>.",
                        "load a checkpoint saved by the same composition, unmodified.");
    return s;
  }
  /// Restores a saved state. A tuner that was probing or verifying starts that phase over (its
  /// partial samples are not saved); a settled one stays settled on its plan.
  void restore_state(const saved_state& s) {
    restart();
    retunes_ = s.retunes;
    fit_ = {s.alpha, s.beta};
    fit_hier_ = {s.hier_alpha, s.hier_beta};
    if (s.ph == phase::settled) {
      phase_ = phase::settled;
      current_ = s.current;
      ref_iteration_ = s.ref_iteration;
      ref_span_ = s.ref_span;
      seen_ = s.seen;
    }
  }

 private:
  void restart() {
    phase_ = phase::probe;
    probe_index_ = 0;
    current_ = probes_[0];
    best_measured_ = 1e300;
    best_probe_ = probes_[0];
    ready_sum_.clear();
    ready_count_ = 0;
    probe_times_.assign(probes_.size(), {});
    probe_scores_.clear();
    finals_.clear();
    final_times_.clear();
    sample_bytes_.clear();
    sample_s_.clear();
    hier_bytes_.clear();
    hier_s_.clear();
    spans_.clear();
    window_it_.clear();
    window_span_.clear();
    drift_seen_ = false;
    seen_ = 0;
  }
  // Settled: one iteration into the drift window; when it is full, its medians (iteration time,
  // backward span) go to out and it starts over.
  bool add_to_window(double iteration_s, double span_s, double (&out)[2]) {
    window_it_.push_back(iteration_s);
    window_span_.push_back(span_s);
    if (window_it_.size() < static_cast<std::size_t>(s_.window)) return false;
    out[0] = median(window_it_);
    out[1] = median(window_span_);
    window_it_.clear();
    window_span_.clear();
    return true;
  }
  void settle(fusion_plan p, double) {
    phase_ = phase::settled;
    current_ = p;
    ref_iteration_ = 0;  // set by the first settled window
    ref_span_ = 0;
    drift_seen_ = false;
    spans_.clear();
  }
  static double span_of(const std::vector<double>& r) {
    if (r.empty()) return 0.0;
    return *std::max_element(r.begin(), r.end());
  }
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t k = v.size() / 2;
    return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
  }

  const Layout* layout_;
  const plan::pool_plan* pool_;
  std::size_t wire_;
  tuner_settings s_;
  bool hybrid_;
  std::vector<fusion_plan> probes_;
  fusion_plan current_{}, best_probe_{}, model_choice_{};
  phase phase_ = phase::probe;
  std::size_t probe_index_ = 0;
  double best_measured_ = 1e300;
  plan::alpha_beta fit_{}, fit_hier_{};
  std::vector<double> ready_sum_;
  std::size_t ready_count_ = 0;
  std::vector<std::vector<double>> probe_times_, final_times_;  // probe / verify: each plan's iteration times so far
  std::vector<fusion_plan> finals_;  // verify: the best-scored probes and the model's choice
  std::vector<double> probe_scores_, final_scores_;
  std::vector<double> sample_bytes_, sample_s_, hier_bytes_, hier_s_, spans_, window_it_, window_span_, packed_;
  double ref_iteration_ = 0, ref_span_ = 0;
  bool drift_seen_ = false;  // settled: the last window moved by more than drift
  std::uint64_t retunes_ = 0, seen_ = 0;
};

}  // namespace gflow::detail
