#pragma once
// The fusion auto-tuner behind Fusion<Auto> (docs/DESIGN.md, "Auto-tuner").
//
//   using Exchange = gflow::Exchanger<gflow::Fusion<gflow::Auto>, gflow::Overlap<gflow::Funneled>>;
//
// After every finish() the exchanger hands the tuner this rank's measurements of the iteration:
// when each tensor became ready (since the iteration's first ready()), how long each bucket's
// exchange took, and the iteration's time. The tuner
//   1. probes: runs a few fixed thresholds (the initial one, 64 KiB, 256 KiB, 1 MiB, 16 MiB), five
//      iterations each, collecting (bucket bytes, seconds) and the ready times;
//   2. fits alpha + beta * bytes to the bucket times (plan/cost_model.hpp) and picks the
//      threshold (2^16 ... 2^28 bytes) and first bucket that minimise the modelled completion of
//      the iteration: buckets launch when the ready prefix covers them and run one after another
//      on the issuing thread, so bucket b ends at max(launch_b, end_{b-1}) + alpha + beta * bytes_b;
//   3. verifies: runs the model's choice and keeps it, or the fastest probe if that measured
//      faster (the model cannot see e.g. a bucket falling out of the cache);
//   4. settles, and watches: the first `window` settled iterations give the reference (medians of
//      the iteration time and of the backward's span); when a later window's median moves by more
//      than `drift` from it, it probes again.
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

#include "error.hpp"
#include "layout.hpp"
#include "plan/buckets.hpp"
#include "plan/cost_model.hpp"
#include "plan/pool.hpp"
#include "transport/transport.hpp"

namespace gflow {

/// One iteration as one rank saw it.
struct tuner_sample {
  std::vector<double> ready_s;   // per tensor (layout index): seconds since the iteration's first ready()
  std::vector<double> bucket_s;  // per bucket of the plan in use: seconds its exchange took
  double iteration_s = 0;        // first ready() to finish()'s return
};

struct tuner_settings {
  // besides the initial threshold; factor-4 steps over the range where this machine's sweeps found the best
  std::vector<std::size_t> probes{std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  // per probe and for the verification; the median counts (3 let a 7%-slower threshold win on noise
  // on 2 shared cores: docs/BENCHMARKS.md, auto-tuner)
  int iterations_per_plan = 5;
  int window = 10;              // settled: iterations per drift check
  double drift = 0.2;           // relative change that triggers a new probe
  std::size_t min_threshold = std::size_t{64} << 10;
  std::size_t max_threshold = std::size_t{256} << 20;
};

namespace detail {

/// The modelled completion of an iteration (seconds since its first ready()) for a bucket plan:
/// buckets launch in pool order when the ready prefix covers them and are exchanged one after
/// another, bucket b taking cost.time(its wire bytes).
inline double modelled_completion(const plan::pool_plan& pool, std::span<const plan::bucket> buckets, std::span<const double> ready_s,
                                  std::size_t wire_bytes_per_element, const plan::alpha_beta& cost) {
  double prefix = 0, end = 0;
  std::size_t pos = 0;
  for (const plan::bucket& b : buckets) {
    for (; pos < b.end_pos; ++pos) prefix = std::max(prefix, ready_s[pool.tensor_at[pos]]);
    end = std::max(end, prefix) + cost.time(static_cast<double>(b.count * wire_bytes_per_element));
  }
  return end;
}

/// A fusion plan: threshold and first bucket, in wire bytes.
struct fusion_plan {
  std::size_t threshold = 0, first = 0;
  friend bool operator==(const fusion_plan&, const fusion_plan&) = default;
};

class fusion_tuner {
 public:
  enum class phase : std::uint32_t { probe = 0, verify = 1, settled = 2 };

  fusion_tuner(const Layout& layout, const plan::pool_plan& pool, std::size_t wire_bytes, std::size_t initial, tuner_settings s = {})
      : layout_(&layout), pool_(&pool), wire_(wire_bytes), s_(std::move(s)) {
    if (s_.iterations_per_plan < 1 || s_.window < 1 || !(s_.drift > 0) || s_.min_threshold == 0 || s_.max_threshold < s_.min_threshold)
      throw invalid_argument("tuner_settings", "iterations_per_plan and window must be >= 1, drift > 0 and 0 < min_threshold <= max_threshold.",
                             "keep the defaults or pass positive numbers.");
    probes_.push_back({initial, 0});
    for (std::size_t p : s_.probes)
      if (p > 0 && std::find(probes_.begin(), probes_.end(), fusion_plan{p, 0}) == probes_.end()) probes_.push_back({p, 0});
    restart();
  }

  /// The plan the next iteration should use.
  [[nodiscard]] fusion_plan current() const noexcept { return current_; }
  [[nodiscard]] phase state() const noexcept { return phase_; }
  [[nodiscard]] const plan::alpha_beta& fitted() const noexcept { return fit_; }
  [[nodiscard]] std::uint64_t retunes() const noexcept { return retunes_; }
  /// Iterations observed since the last (re)start of probing.
  [[nodiscard]] std::uint64_t iterations_in_phase() const noexcept { return seen_; }

  /// Feeds one iteration measured under current(); collective over t (every rank, after every
  /// finish()). Returns the plan for the next iteration: the same on every rank (rank 0's).
  template <class T>
  fusion_plan step(T& t, const tuner_sample& mine, std::size_t bucket_count) {
    const std::size_t n = layout_->size();
    if (mine.ready_s.size() != n || mine.bucket_s.size() != bucket_count)
      throw invalid_argument("sample", "the tuner got " + std::to_string(mine.ready_s.size()) + " ready times and " +
                                           std::to_string(mine.bucket_s.size()) + " bucket times; the plan has " + std::to_string(n) +
                                           " tensors and " + std::to_string(bucket_count) + " buckets.",
                             "pass one ready time per tensor and one time per bucket of the plan in use.");
    // 1. the slowest rank's view, identical everywhere
    const bool full = phase_ != phase::settled;
    packed_.clear();
    packed_.push_back(mine.iteration_s);
    packed_.push_back(span_of(mine.ready_s));
    if (full) {
      packed_.insert(packed_.end(), mine.ready_s.begin(), mine.ready_s.end());
      packed_.insert(packed_.end(), mine.bucket_s.begin(), mine.bucket_s.end());
    }
    t.all_reduce(packed_.data(), packed_.size(), reduce_op::max);
    // 2. the state machine, on the reduced numbers
    observe(std::span<const double>(packed_), bucket_count);
    // 3. rank 0's plan for everyone
    std::uint64_t d[3] = {current_.threshold, current_.first, static_cast<std::uint64_t>(phase_)};
    t.broadcast(d, 3, 0);
    current_ = {static_cast<std::size_t>(d[0]), static_cast<std::size_t>(d[1])};
    phase_ = static_cast<phase>(d[2]);
    return current_;
  }

  /// The deterministic core (also what tests drive): `reduced` = [iteration_s, backward span,
  /// then in probe/verify the ready times and the bucket times].
  void observe(std::span<const double> reduced, std::size_t bucket_count) {
    const std::size_t n = layout_->size();
    const double it_s = reduced[0], span_s = reduced[1];
    ++seen_;
    if (phase_ == phase::settled) {
      window_it_.push_back(it_s);
      window_span_.push_back(span_s);
      if (window_it_.size() >= static_cast<std::size_t>(s_.window)) {
        const double mi = median(window_it_), ms = median(window_span_);
        window_it_.clear();
        window_span_.clear();
        if (ref_iteration_ <= 0) {  // the first settled window is the reference (a median of `window`, not of a probe's few)
          ref_iteration_ = mi;
          ref_span_ = ms;
          return;
        }
        const bool moved = std::abs(mi - ref_iteration_) > s_.drift * ref_iteration_ ||
                           (ref_span_ > 0 && std::abs(ms - ref_span_) > s_.drift * ref_span_);
        if (moved) {
          ++retunes_;
          restart();
        }
      }
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
        sample_bytes_.push_back(static_cast<double>(plan_b[b].count * wire_));
        sample_s_.push_back(bucket[b]);
      }
    }
    times_.push_back(it_s);
    spans_.push_back(span_s);
    if (times_.size() < static_cast<std::size_t>(s_.iterations_per_plan)) return;
    const double m = median(times_);
    times_.clear();
    if (phase_ == phase::probe) {
      if (m < best_measured_) {
        best_measured_ = m;
        best_probe_ = current_;
      }
      if (++probe_index_ < probes_.size()) {
        current_ = probes_[probe_index_];
        return;
      }
      // every probe measured: fit, model, verify the choice
      fit_ = plan::fit_alpha_beta(sample_bytes_, sample_s_);
      std::vector<double> ready_mean(n);
      for (std::size_t i = 0; i < n; ++i) ready_mean[i] = ready_sum_[i] / static_cast<double>(ready_count_);
      model_choice_ = best_model_plan(ready_mean);
      if (std::find(probes_.begin(), probes_.end(), model_choice_) != probes_.end()) {
        settle(best_probe_, best_measured_);  // the model's choice was a probe: keep the one measured fastest
        return;
      }
      phase_ = phase::verify;
      current_ = model_choice_;
      return;
    }
    // verify: keep the faster of the model's choice and the best probe
    if (m <= best_measured_) settle(current_, m);
    else settle(best_probe_, best_measured_);
  }

  /// The plan among the candidates that minimises the modelled completion.
  [[nodiscard]] fusion_plan best_model_plan(std::span<const double> ready_s) const {
    fusion_plan best{};
    double best_t = 0;
    for (std::size_t th = s_.min_threshold; th <= s_.max_threshold; th *= 2) {
      for (std::size_t first : {std::size_t{0}, th / 8, th / 4}) {
        if (first != 0 && first < s_.min_threshold / 4) continue;
        const auto b = plan::plan_buckets(*layout_, *pool_, {wire_, th, first});
        const double t = modelled_completion(*pool_, b, ready_s, wire_, fit_);
        if (best.threshold == 0 || t < best_t * (1 - 1e-9)) {
          best = {th, first};
          best_t = t;
        }
      }
    }
    return best;
  }

  // ---- checkpoints: everything the decisions depend on ----------------------------------------
  template <class Writer>
  void save_state(Writer& w) const {
    w.u64(current_.threshold);
    w.u64(current_.first);
    w.u32(static_cast<std::uint32_t>(phase_));
    w.u64(probe_index_);
    w.u64(best_probe_.threshold);
    w.u64(best_probe_.first);
    w.f64(best_measured_);
    w.f64(fit_.alpha);
    w.f64(fit_.beta);
    w.f64(ref_iteration_);
    w.f64(ref_span_);
    w.u64(retunes_);
    w.u64(seen_);
  }
  struct saved_state {
    fusion_plan current, best_probe;
    phase ph;
    std::uint64_t probe_index, retunes, seen;
    double best_measured, alpha, beta, ref_iteration, ref_span;
  };
  template <class Reader>
  [[nodiscard]] saved_state read_state(Reader& r) const {
    saved_state s{};
    s.current.threshold = static_cast<std::size_t>(r.u64("tuner threshold"));
    s.current.first = static_cast<std::size_t>(r.u64("tuner first bucket"));
    const std::uint32_t ph = r.u32("tuner phase");
    if (ph > 2) throw parse_error("tuner phase", "the checkpoint's tuner phase is " + std::to_string(ph) + " (0-2 expected).", "load an unmodified checkpoint.");
    s.ph = static_cast<phase>(ph);
    s.probe_index = r.u64("tuner probe");
    s.best_probe.threshold = static_cast<std::size_t>(r.u64("tuner best probe"));
    s.best_probe.first = static_cast<std::size_t>(r.u64("tuner best probe first"));
    s.best_measured = r.f64("tuner best time");
    s.alpha = r.f64("tuner alpha");
    s.beta = r.f64("tuner beta");
    s.ref_iteration = r.f64("tuner reference iteration");
    s.ref_span = r.f64("tuner reference span");
    s.retunes = r.u64("tuner retunes");
    s.seen = r.u64("tuner iterations");
    if (s.current.threshold == 0)
      throw parse_error("tuner threshold", "the checkpoint's tuned threshold is 0.", "load an unmodified checkpoint.");
    return s;
  }
  /// Restores a saved state. A tuner that was probing or verifying starts that phase over (its
  /// partial samples are not saved); a settled one stays settled on its plan.
  void restore_state(const saved_state& s) {
    restart();
    retunes_ = s.retunes;
    fit_ = {s.alpha, s.beta};
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
    sample_bytes_.clear();
    sample_s_.clear();
    times_.clear();
    spans_.clear();
    window_it_.clear();
    window_span_.clear();
    seen_ = 0;
  }
  void settle(fusion_plan p, double) {
    phase_ = phase::settled;
    current_ = p;
    ref_iteration_ = 0;  // set by the first settled window
    ref_span_ = 0;
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
  std::vector<fusion_plan> probes_;
  fusion_plan current_{}, best_probe_{}, model_choice_{};
  phase phase_ = phase::probe;
  std::size_t probe_index_ = 0;
  double best_measured_ = 1e300;
  plan::alpha_beta fit_{};
  std::vector<double> ready_sum_;
  std::size_t ready_count_ = 0;
  std::vector<double> sample_bytes_, sample_s_, times_, spans_, window_it_, window_span_, packed_;
  double ref_iteration_ = 0, ref_span_ = 0;
  std::uint64_t retunes_ = 0, seen_ = 0;
};

}  // namespace detail
}  // namespace gflow
