#pragma once
// The CSC sparsifier engine (Sparsifier<CSC<chunk_elems, percent>>; what it does, its accounting,
// non-finite values, checkpoints and warm-up are described with the tag in policies/csc.hpp).
// Its contract is gflow::detail::sparsifier_engine (engines/concepts.hpp), asserted below.
//
// Memory (allocated in the constructor; no allocation per iteration): the history (one float per
// pool element), the compaction buffer (one element of the wire type per pool element, since
// warm-up exchanges everything), chunk norms and three chunk lists (this iteration's, the last
// one's for the optimizer, the next one's).
//
// Memory spaces: the engine is written once over the backend (engines/concepts.hpp): every kernel
// goes through cx.kernels, host_backend forwarding to kernels/sparse_chunks.hpp and the CUDA
// device_backend to include/gflow/detail/cuda/sparse_chunks.cuh on the transport's stream (NCCL). The
// chunk lists live twice: in the backend's memory for the kernels, and on the host, where the
// cursors of exchange() and the checkpoint read them. What reaches the host on device memory:
// the next selection (chunk indices, 4 bytes per chunk) once per iteration in end_iteration(),
// after the device selection, because the host decides which chunks each bucket completes; and
// the history / norms in save_state (a checkpoint is written by the host). Gradients never do.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../support/checkpoint.hpp"
#include "../../error.hpp"
#include "../kernels/sparse_chunks.hpp"
#include "../plan/chunks.hpp"
#include "archetype.hpp"
#include "concepts.hpp"

namespace gflow::detail {

/// CSC's defaults (CSC<...>::default_warmup, default_ramp, default_momentum).
struct csc_defaults {
  static constexpr std::uint64_t warmup = 100;
  static constexpr std::uint64_t ramp = 1000;
  static constexpr float momentum = 1.0f;  // nothing lost; Algorithm 1 trainers pass theirs
};

template <class Ctx, std::size_t ChunkElems, unsigned Percent>
class csc_engine {
  using wire_t = typename Ctx::wire_type;
  template <class E>
  using buffer = typename Ctx::backend::template buffer<E>;

 public:
  // For the Overlap policies: CSC's buffer and selection cursors cross buckets (no
  // Concurrent<N>), and its exchange does not split into start/complete phases (no Chained).
  // Overlap<Funneled> works: exchange() only touches chunks the ready prefix has completed.
  static constexpr bool phased = false;
  static constexpr bool independent_buckets = false;

  explicit csc_engine(Ctx& cx)
      : cx_(&cx), geo_(cx.pool->total, ChunkElems), hist_(geo_.pool_elems()), norms_(geo_.count()), d_cur_(geo_.count()), d_next_(geo_.count()) {
    if constexpr (Ctx::narrow) wire_ = buffer<wire_t>(geo_.pool_elems());  // compacted straight into the wire type
    else buf_ = buffer<float>(geo_.pool_elems());
    const std::size_t nc = geo_.count();
    cur_.resize(nc);
    last_.resize(nc);
    next_.resize(nc);
    std::iota(cur_.begin(), cur_.end(), std::uint32_t{0});  // iteration 0: every chunk (no norms yet)
    cx_->kernels->upload(d_cur_.data(), cur_.data(), nc);
    ncur_ = nc;
    rest_pos_ = nc;
    replan();
  }

  csc_engine(const csc_engine&) = delete;
  csc_engine& operator=(const csc_engine&) = delete;

  /// The buckets changed (between iterations): recompute which chunks each bucket completes.
  void replan() {
    in_iteration_check("replan");
    ranges_ = plan::plan_chunk_ranges(geo_, *cx_->buckets);
  }

  /// Bucket b's gradients are final: handle the chunks it completes (compaction of the
  /// selected ones, Algorithm 1's history for the others), and allreduce the buffer when the
  /// fusion threshold is reached (every bucket without Fusion).
  void exchange(std::size_t b) {
    if (b != next_bucket_)
      throw usage_error("exchange", fmt::format("CSC got bucket {} where bucket {} was next.", b, next_bucket_),
                        "exchange buckets once each, in pool order (the Exchanger does).");
    ++next_bucket_;
    const auto [lo, hi] = ranges_[b];
    if (lo == hi) return;
    const std::size_t n = geo_.pool_elems();
    float* pool = cx_->grads;
    // Selected chunks in [lo, hi): the next run of the sorted selection.
    const std::size_t s0 = sel_pos_;
    while (sel_pos_ < ncur_ && cur_[sel_pos_] < hi) ++sel_pos_;
    const std::uint32_t* dlist = d_cur_.data();
    auto& k = *cx_->kernels;
    if constexpr (Ctx::narrow)  // cast while compacting; the history keeps the encoding's rounding error
      k.compact_chunks_to_wire(pool, hist_.data(), n, ChunkElems, dlist + s0, sel_pos_ - s0, wire_.data() + pending_, cx_->mean_scale(),
                               cx_->average ? static_cast<float>(cx_->ranks()) : 1.0f);
    else
      k.compact_chunks(pool, hist_.data(), n, ChunkElems, dlist + s0, sel_pos_ - s0, buf_.data() + pending_);
    pending_ += elements_of(s0, sel_pos_);
    // Kept-back chunks in [lo, hi): the next run of the sorted complement.
    const std::size_t u0 = rest_pos_;
    while (rest_pos_ < geo_.count() && cur_[rest_pos_] < hi) ++rest_pos_;
    k.defer_chunks(pool, hist_.data(), n, ChunkElems, dlist + u0, rest_pos_ - u0, momentum_, norms_.data());
    if (pending_ != 0 && (!cx_->fused() || pending_ * sizeof(wire_t) >= *cx_->threshold_bytes)) flush();
  }

  /// After the last bucket: exchange what is left in the buffer, then allreduce the chunk
  /// norms and select the chunks of the next iteration.
  void end_iteration() {
    if (next_bucket_ != ranges_.size())
      throw usage_error("end_iteration", fmt::format("CSC reached the end of the iteration after {} of "
                                             "{} buckets.", next_bucket_, ranges_.size()),
                        "exchange every bucket before ending the iteration (the Exchanger does).");
    if (pending_ != 0) flush();
    const std::size_t nc = geo_.count();
    const std::uint64_t it = *cx_->iteration;
    const std::size_t k = schedule().selected(it + 1, nc);
    auto& kern = *cx_->kernels;
    if (k < nc || ncur_ < nc) {
      cx_->sum(norms_.data(), nc);
      bytes_ += nc * sizeof(float);
      ++collectives_;
      // Kept-back chunks whose summed norm is inf/NaN: report them on every rank.
      kern.count_nonfinite_at(norms_.data(), d_cur_.data() + ncur_, nc - ncur_);
    }
    kern.select_top_chunks(norms_.data(), nc, k, d_next_.data());  // k == nc: every chunk, ascending
    // The selection reaches the host (4 bytes per chunk, once per iteration): the host cursors
    // of exchange() decide which chunks each bucket completes. On device memory this waits for
    // the stream, where finish() waits anyway.
    kern.download(next_.data(), d_next_.data(), nc);
    // last_ <- the iteration just finished, cur_ <- the next one.
    std::swap(last_, cur_);
    nlast_ = ncur_;
    std::swap(cur_, next_);
    std::swap(d_cur_, d_next_);
    ncur_ = k;
    last_bytes_ = bytes_;
    last_collectives_ = collectives_;
    bytes_ = 0;
    collectives_ = 0;
    next_bucket_ = 0;
    sel_pos_ = 0;
    flushed_ = 0;
    rest_pos_ = k;
  }

  /// Bytes this rank handed to collectives in the iteration finish() last completed: the
  /// compacted chunks in the wire type plus the fp32 norms when they were allreduced.
  [[nodiscard]] std::size_t wire_bytes() const noexcept { return last_bytes_; }
  /// Collectives issued in that iteration (chunk allreduces + the norm allreduce).
  [[nodiscard]] std::size_t collectives() const noexcept { return last_collectives_; }

  // ---- for the optimizer (Algorithm 1's SGD update step) ----------------------------------
  /// The chunks exchanged in the iteration finish() last completed, ascending; the views hold
  /// their averaged gradient, every other chunk holds zero. Empty before the first finish().
  [[nodiscard]] std::span<const std::uint32_t> selected_chunks() const noexcept { return {last_.data(), nlast_}; }
  /// The chunks the iteration in progress (or, between iterations, the next one) exchanges.
  [[nodiscard]] std::span<const std::uint32_t> upcoming_chunks() const noexcept { return {cur_.data(), ncur_}; }
  [[nodiscard]] const plan::chunk_geometry& geometry() const noexcept { return geo_; }
  [[nodiscard]] std::size_t chunk_elems() const noexcept { return ChunkElems; }
  [[nodiscard]] std::size_t chunk_count() const noexcept { return geo_.count(); }

  // ---- state (saved and restored by Exchanger::save_state / load_state) ----------------------
  /// Algorithm 1's historical gradient hg, one per pool element (pool order): momentum * g for
  /// chunks this rank kept back; for chunks exchanged 0 (fp32 wire) or the rounding error of
  /// the 16-bit encoding (fp16 / bf16 wire), which goes out with the chunk's next exchange.
  [[nodiscard]] std::span<const float> residual() const noexcept { return {hist_.data(), hist_.size()}; }
  [[nodiscard]] std::span<float> residual() noexcept { return {hist_.data(), hist_.size()}; }
  /// The chunk norms of the iteration finish() last completed (allreduced when that happened).
  [[nodiscard]] std::span<const float> norms() const noexcept { return {norms_.data(), norms_.size()}; }

  // ---- settings (between iterations; every rank must pass the same values) -----------------
  [[nodiscard]] float momentum() const noexcept { return momentum_; }
  [[nodiscard]] std::uint64_t warmup_iterations() const noexcept { return warmup_; }
  [[nodiscard]] std::uint64_t ramp_iterations() const noexcept { return ramp_; }
  [[nodiscard]] unsigned percent() const noexcept { return percent_; }
  [[nodiscard]] plan::csc_schedule schedule() const noexcept { return {warmup_, ramp_, percent_}; }

  /// Algorithm 1's momentum: kept-back gradients stay as momentum * g. In [0, 1].
  void set_momentum(float m) {
    in_iteration_check("set_momentum");
    if (!(m >= 0.0f && m <= 1.0f))  // also rejects NaN
      throw invalid_argument("momentum", fmt::format("the CSC momentum must lie in [0, 1] (got {:f}).", m),
                             "pass the optimizer's momentum, e.g. 0.9; 1 keeps kept-back gradients whole.");
    momentum_ = m;
  }
  /// Dense for the first `warmup` iterations, then a linear ramp to percent() over `ramp`.
  void set_warmup(std::uint64_t warmup, std::uint64_t ramp) {
    in_iteration_check("set_warmup");
    if (ramp > plan::csc_schedule::max_ramp)
      throw invalid_argument("ramp", fmt::format("the CSC ramp of {} iterations is longer than supported ("
                                         "{}).", ramp, plan::csc_schedule::max_ramp),
                             "pass a ramp of at most 2^32 iterations.");
    warmup_ = warmup;
    ramp_ = ramp;
  }
  /// Overrides the type's Percent at run time (auto-tuning). In (0, 100].
  void set_percent(unsigned p) {
    in_iteration_check("set_percent");
    if (p == 0 || p > 100)
      throw invalid_argument("percent", fmt::format("the percent of CSC chunks exchanged must lie in (0, 100] (got {}).", p),
                             "pass e.g. 15; 100 exchanges every chunk.");
    percent_ = p;
  }

  // ---- checkpoint (Exchanger::save_state / load_state; between iterations) ------------------
  /// What load reads and validates before anything changes; restore_state applies it.
  struct saved_state {
    std::vector<float> hist, norms;
    std::vector<std::uint32_t> cur, last;  // full partitions: selected ascending, then the others
    std::size_t ncur = 0, nlast = 0;
    float momentum = csc_defaults::momentum;
    std::uint64_t warmup = csc_defaults::warmup, ramp = csc_defaults::ramp;
    unsigned percent = Percent;
  };

  void save_state(detail::checkpoint_writer& w) const {
    in_iteration_check("save_state");
    const std::size_t nc = geo_.count();
    w.f32(momentum_);
    w.u64(warmup_);
    w.u64(ramp_);
    w.u32(percent_);
    w.u64(ncur_);
    w.array(cur_.data(), nc);
    w.u64(nlast_);
    w.array(last_.data(), nlast_);  // selected_chunks(); the rest of last_ is scratch
    // Device memory: the checkpoint is written by the host, so the state comes down here.
    std::vector<float> norms(nc), hist(geo_.pool_elems());
    cx_->kernels->download(norms.data(), norms_.data(), nc);
    cx_->kernels->download(hist.data(), hist_.data(), hist.size());
    w.array(norms.data(), nc);
    w.array(hist.data(), hist.size());
  }

  [[nodiscard]] saved_state read_state(detail::checkpoint_reader& r) const {
    const std::size_t nc = geo_.count();
    saved_state s;
    s.momentum = r.f32("momentum");
    if (!(s.momentum >= 0.0f && s.momentum <= 1.0f)) r.fail("momentum", fmt::format("the checkpoint's CSC momentum {:f} is outside [0, 1].", s.momentum));
    s.warmup = r.u64("warmup");
    s.ramp = r.u64("ramp");
    if (s.ramp > plan::csc_schedule::max_ramp) r.fail("ramp", fmt::format("the checkpoint's CSC ramp of {} iterations is out of range.", s.ramp));
    s.percent = r.u32("percent");
    if (s.percent == 0 || s.percent > 100) r.fail("percent", fmt::format("the checkpoint's CSC percent {} is outside (0, 100].", s.percent));
    s.ncur = static_cast<std::size_t>(r.u64("the selection size"));
    if (s.ncur == 0 || s.ncur > nc)
      r.fail("selection", fmt::format("the checkpoint selects {} chunks of {} (at least 1 is always selected).", s.ncur, nc));
    r.array_exact(s.cur, nc, "the selection");
    check_partition(r, s.cur, s.ncur, "selection");
    s.nlast = static_cast<std::size_t>(r.u64("the last selection size"));
    if (s.nlast > nc)
      r.fail("selected_chunks", fmt::format("the checkpoint's last selection holds {} chunks of {}.", s.nlast, nc));
    r.array_exact(s.last, s.nlast, "the last selection");
    // Complete it into a partition (the same shape as the engine's lists), then validate.
    std::vector<std::uint8_t> in(nc, 0);
    for (std::uint32_t c : s.last)
      if (c < nc) in[c] = 1;
    for (std::uint32_t c = 0; c < nc; ++c)
      if (!in[c]) s.last.push_back(c);
    if (s.last.size() != nc) r.fail("selected_chunks", "the checkpoint's last selection repeats a chunk or names one past the last.");
    check_partition(r, s.last, s.nlast, "selected_chunks");
    r.array_exact(s.norms, nc, "the chunk norms");  // any value: an inf/NaN norm is state too
    r.array_exact(s.hist, geo_.pool_elems(), "the history");
    detail::check_finite(s.hist.data(), s.hist.size(), "history");
    return s;
  }

  /// Applies a validated state (read_state); allocates nothing (device memory: three uploads).
  void restore_state(saved_state&& s) noexcept(!Ctx::backend::stream_ordered) {
    cx_->kernels->upload(hist_.data(), s.hist.data(), s.hist.size());
    cx_->kernels->upload(norms_.data(), s.norms.data(), s.norms.size());
    cx_->kernels->upload(d_cur_.data(), s.cur.data(), s.cur.size());
    cur_.swap(s.cur);
    last_.swap(s.last);
    ncur_ = s.ncur;
    nlast_ = s.nlast;
    momentum_ = s.momentum;
    warmup_ = s.warmup;
    ramp_ = s.ramp;
    percent_ = s.percent;
    next_bucket_ = sel_pos_ = flushed_ = pending_ = 0;
    rest_pos_ = ncur_;
  }

 private:
  // [0, n) and [n, chunks) strictly ascending, every chunk exactly once.
  void check_partition(const detail::checkpoint_reader& r, const std::vector<std::uint32_t>& list, std::size_t n, const char* what) const {
    const std::size_t nc = geo_.count();
    std::vector<std::uint8_t> seen(nc, 0);
    for (std::size_t j = 0; j < list.size(); ++j) {
      const std::uint32_t c = list[j];
      if (c >= nc || seen[c] || (j != 0 && j != n && c <= list[j - 1]))
        r.fail(what, fmt::format("the checkpoint's chunk list '{}' is not a partition of the {}"
                         " chunks into two ascending runs (entry {} is chunk {}).", what, nc, j, c));
      seen[c] = 1;
    }
  }

  // Elements of the chunks cur_[a, b) (ascending): only the pool's last chunk can be partial.
  [[nodiscard]] std::size_t elements_of(std::size_t a, std::size_t b) const noexcept {
    if (a == b) return 0;
    std::size_t e = (b - a) * ChunkElems;
    if (cur_[b - 1] + 1 == geo_.count()) e -= geo_.count() * ChunkElems - geo_.pool_elems();
    return e;
  }

  void in_iteration_check(const char* what) const {
    if (next_bucket_ != 0)
      throw usage_error(what, fmt::format("called in the middle of an iteration (after {} buckets were exchanged).", next_bucket_),
                        "change CSC settings between finish() and the next ready().");
  }

  // Allreduce the compacted chunks cur_[flushed_, sel_pos_) through the Topology and scatter
  // them back; their norms (divided by P as a sum) come from the scatter. The Precision steps of
  // exchange_context::dense_allreduce, fused into the compaction and the scatter: a 16-bit wire
  // was divided by P and cast while compacting, and is widened (inf/NaN counted) while
  // scattering; an fp32 buffer is averaged (when asked) and counted while scattering.
  void flush() {
    const float to_sum_over_p = cx_->average ? 1.0f : 1.0f / static_cast<float>(cx_->ranks());
    const std::size_t count = sel_pos_ - flushed_, n = geo_.pool_elems();
    const std::uint32_t* dlist = d_cur_.data() + flushed_;
    auto& k = *cx_->kernels;
    if constexpr (Ctx::narrow) {
      cx_->sum(wire_.data(), pending_);
      k.scatter_chunks_from_wire(wire_.data(), cx_->grads, n, ChunkElems, dlist, count, norms_.data(), to_sum_over_p);
    } else {
      cx_->sum(buf_.data(), pending_);
      k.scatter_chunks_counted(buf_.data(), cx_->grads, n, ChunkElems, dlist, count, cx_->average, cx_->mean_scale(), norms_.data(), to_sum_over_p);
    }
    bytes_ += pending_ * sizeof(wire_t);
    ++collectives_;
    pending_ = 0;
    flushed_ = sel_pos_;
  }

  Ctx* cx_;
  plan::chunk_geometry geo_;
  buffer<float> hist_;
  buffer<float> buf_;
  buffer<wire_t> wire_;
  buffer<float> norms_;
  buffer<std::uint32_t> d_cur_, d_next_;  // cur_ and the next selection in the backend's memory, for the kernels
  std::vector<plan::chunk_range> ranges_;
  // Chunk lists, each a partition: [0, n) selected ascending, [n, chunks) the others ascending.
  std::vector<std::uint32_t> cur_, last_, next_;
  std::size_t ncur_ = 0, nlast_ = 0;
  std::size_t next_bucket_ = 0;
  std::size_t sel_pos_ = 0;   // cursor in cur_[0, ncur_)
  std::size_t rest_pos_ = 0;  // cursor in cur_[ncur_, chunks)
  std::size_t flushed_ = 0;   // cur_[flushed_, sel_pos_) are in the buffer
  std::size_t pending_ = 0;   // elements in the buffer
  std::size_t bytes_ = 0, collectives_ = 0, last_bytes_ = 0, last_collectives_ = 0;
  float momentum_ = csc_defaults::momentum;
  std::uint64_t warmup_ = csc_defaults::warmup;
  std::uint64_t ramp_ = csc_defaults::ramp;
  unsigned percent_ = Percent;
};

// csc_engine meets gflow::detail::sparsifier_engine, on fp32 and 16-bit wires, and counts its collectives.
static_assert(sparsifier_engine<csc_engine<archetype_context<>, 8, 25>, archetype_context<>> &&
                  sparsifier_engine<csc_engine<archetype_context<half>, 8, 25>, archetype_context<half>> &&
                  counts_collectives<csc_engine<archetype_context<>, 8, 25>>,
              "gflow::detail::csc_engine must meet gflow::detail::sparsifier_engine (engines/concepts.hpp)");

}  // namespace gflow::detail
