#pragma once
// Sparsifier<CSC<chunk_elems, percent>>: coarse-grained sparse communication (paper 000 section
// 3.2, Figures 17-18, Algorithm 1).
//
//   using Exchange = gflow::Exchanger<gflow::Sparsifier<gflow::CSC<32768, 15>>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   ex.sparsifier().set_warmup(500, 2000);            // optional: dense iterations, ramp iterations
//   ... ready(i) ...; auto st = ex.finish();
//   if (st.finite()) opt.step(weights, {ex.pool_data(), ex.pool_size()},        // optim/momentum_sgd.hpp
//                             ex.sparsifier().selected_chunks(), ex.sparsifier().chunk_elems());
//
// What one iteration does (every rank holds the same selection S, a sorted list of chunks):
//   1. The pool is cut into chunks of chunk_elems elements (plan/chunks.hpp; the last is partial).
//   2. As buckets complete (exchange(b), pool order), every chunk that is now complete (its end
//      <= the bucket's end) is handled, Algorithm 1's "AllReduce Preprocess Step":
//        - c in S: g + hg is compacted into a buffer and hg = 0 (fp32 wire); with a 16-bit wire
//          the compaction casts, W((g + hg) / P) (or W(g + hg) for sums), and hg keeps the
//          rounding error of that encoding, (g + hg) - P * float(W) (kernels::
//          compact_chunks_to_wire), so that the 16-bit wire loses nothing a rank could keep;
//        - c not in S: g = g + hg, hg = momentum * g, and the pool is cleared there.
//      With Fusion the buffer is allreduced once it holds at least the fusion threshold in wire
//      bytes; without Fusion it is allreduced after each bucket that added to it. The allreduce
//      applies the Precision policy as the exchanger's dense one does (divide by P and cast
//      before, reduce through the Topology, cast back / average and count inf/NaN after), with
//      the steps fused into the compaction and the scatter of the result back into the pool.
//   3. end_iteration(): the rest of the buffer is exchanged; then the chunk norms (below) are
//      allreduced in fp32 through the Topology, and the top `percent` of chunks, ceil, ties to the
//      lower index (kernels::select_top_chunks), become S for the next iteration.
//
// After finish(), the views hold:
//   - chunks in S: the average over ranks of the accumulated gradient g + hg (the sum with
//     exchange_options::average = false), identical on every rank;
//   - other chunks: zero. Algorithm 1's SGD step makes no update there (the optimizer leaves the
//     weight and its momentum alone), and zero keeps an optimizer that ignores the selection
//     (plain SGD) correct. The rank's own accumulated gradient lives on in residual() as
//     momentum * g.
//
// Accounting ("nothing is lost", docs/DESIGN.md): for every element, summed over ranks and
// iterations,  fed in  =  applied  +  residual held now  +  decayed,  where applied is what the
// views held after each finish() (times P when averaged; zero on kept-back chunks) and
// decayed = (1 - momentum) * g at each iteration the element was kept back. Algorithm 1 keeps
// momentum * g, so with momentum = 1 nothing decays and the identity is the plain conservation
// law; momentum < 1 is the paper's choice to let the history decay like a momentum term.
// tests/test_csc.cpp checks the identity in fp64 over 1000+ random iterations (relative error
// <= 1e-5: fp32 additions round), and to the last bit with a 16-bit wire on values for which only
// the 16-bit encoding rounds. What no rank can keep is the rounding of the 16-bit sum itself
// (the wire carries W(sum of the ranks' W values)).
//
// Chunk norms (paper 000, Figure 18): each rank computes, per chunk, the L1 norm of
//   - chunks in S: the exchanged values divided by P as a sum, i.e. L1(sum over ranks) / P (the
//     paper's "divide its L1 norm by the number of GPUs": the allreduce then restores L1(sum));
//   - other chunks: its own accumulated gradient g + hg (before the momentum scaling).
// so both are on the scale of the sum over ranks. The norms are allreduced only when the next
// iteration is sparse or this one was (dense warm-up iterations issue no norm collective).
// Non-finite gradients (docs/DESIGN.md, "Non-finite values"):
//   - in a selected chunk, inf/NaN travels and is counted in the averaged result on every rank
//     (exchange_status::nonfinite); the history there is 0 (no rounding error is kept for a
//     value whose encoding is inf/NaN, nor for a finite value whose fp16 encoding overflows);
//   - in a kept-back chunk, the element's history becomes 0 instead of m * g (kernels::
//     defer_chunks: an inf/NaN history would poison every later exchange of the chunk), and the
//     chunk's norm becomes inf/NaN. Every sparse iteration allreduces the norms, so every rank
//     sees the non-finite sum and counts the chunk once in exchange_status::nonfinite; NaN
//     ranking highest, the chunk is exchanged next iteration (without the dropped value).
//   A finite chunk whose L1 norm overflows fp32 (elements near 1e34) is reported the same way.
//
// Checkpoints (Exchanger::save_state / load_state): the history, the next selection, the last
// one (selected_chunks()), the norms and the settings (momentum, warm-up, ramp, percent).
//
// Warm-up (paper: "start from dense training ... linearly ramping up the sparsity ratio"): every
// chunk for the first max(warmup, 1) iterations, then the fraction ramps linearly to `percent`
// over `ramp` iterations (plan::csc_schedule). The paper gives the warm-up as "several percent
// of iterations" and no momentum value; gflow's defaults are warmup 100, ramp 1000, momentum 1.
// Momentum 1 keeps a kept-back gradient whole (hg = g: nothing is lost, DESIGN.md's invariant holds
// exactly). A trainer that follows Algorithm 1's momentum correction sets set_momentum(m) to its
// optimizer's momentum and updates with gflow::optim::momentum_sgd; the (1 - m) part of a kept-back
// gradient is then accounted for by the optimizer's historical update, not by the residual.
// Set the warm-up to the run: set_warmup(total_iterations / 100, total_iterations / 25) follows
// "several percent".
//
// Memory (allocated in the constructor; no allocation per iteration): the history (one float per
// pool element), the compaction buffer (one element of the wire type per pool element, since
// warm-up exchanges everything), chunk norms and three chunk lists (this iteration's, the last
// one's for the optimizer, the next one's).
//
// Memory spaces: the engine is written once over the backend (detail/concepts.hpp): every kernel
// goes through cx.kernels, host_backend forwarding to kernels/sparse_chunks.hpp and the CUDA
// device_backend to include/gflow/cuda/sparse_chunks.cuh on the transport's stream (NCCL). The
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
#include "../error.hpp"
#include "../kernels/sparse_chunks.hpp"
#include "../plan/chunks.hpp"
#include "sparsifier.hpp"

namespace gflow {

template <std::size_t ChunkElems = 32768, unsigned Percent = 15>
struct CSC {
  static_assert(ChunkElems > 0,
                "gflow::CSC<0, ...>: the chunk size must be positive. Pass the number of gradient elements per chunk, "
                "e.g. gflow::CSC<32768, 15> (the paper's 32K-element chunks).");
  static_assert(Percent > 0 && Percent <= 100,
                "gflow::CSC<..., Percent>: the percent of chunks exchanged per iteration must lie in (0, 100]. "
                "Pass e.g. gflow::CSC<32768, 15> (100 exchanges every chunk, like gflow::Dense).");
  static constexpr std::size_t chunk_elems = ChunkElems;
  static constexpr unsigned percent = Percent;

  static constexpr std::uint64_t default_warmup = 100;
  static constexpr std::uint64_t default_ramp = 1000;
  static constexpr float default_momentum = 1.0f;  // nothing lost; Algorithm 1 trainers pass theirs

  template <class Ctx>
  class engine {
    using wire_t = typename Ctx::wire_type;
    template <class E>
    using buffer = typename Ctx::backend::template buffer<E>;

   public:
    // For the Overlap policies: CSC's buffer and selection cursors cross buckets (no
    // Concurrent<N>), and its exchange does not split into start/complete phases (no Chained).
    // Overlap<Funneled> works: exchange() only touches chunks the ready prefix has completed.
    static constexpr bool phased = false;
    static constexpr bool independent_buckets = false;

    explicit engine(Ctx& cx)
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

    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

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
        throw usage_error("exchange", "CSC got bucket " + std::to_string(b) + " where bucket " + std::to_string(next_bucket_) + " was next.",
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
        throw usage_error("end_iteration", "CSC reached the end of the iteration after " + std::to_string(next_bucket_) + " of " +
                                               std::to_string(ranges_.size()) + " buckets.",
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
        throw invalid_argument("momentum", "the CSC momentum must lie in [0, 1] (got " + std::to_string(m) + ").",
                               "pass the optimizer's momentum, e.g. 0.9; 1 keeps kept-back gradients whole.");
      momentum_ = m;
    }
    /// Dense for the first `warmup` iterations, then a linear ramp to percent() over `ramp`.
    void set_warmup(std::uint64_t warmup, std::uint64_t ramp) {
      in_iteration_check("set_warmup");
      if (ramp > plan::csc_schedule::max_ramp)
        throw invalid_argument("ramp", "the CSC ramp of " + std::to_string(ramp) + " iterations is longer than supported (" +
                                           std::to_string(plan::csc_schedule::max_ramp) + ").",
                               "pass a ramp of at most 2^32 iterations.");
      warmup_ = warmup;
      ramp_ = ramp;
    }
    /// Overrides the type's Percent at run time (auto-tuning). In (0, 100].
    void set_percent(unsigned p) {
      in_iteration_check("set_percent");
      if (p == 0 || p > 100)
        throw invalid_argument("percent", "the percent of CSC chunks exchanged must lie in (0, 100] (got " + std::to_string(p) + ").",
                               "pass e.g. 15; 100 exchanges every chunk.");
      percent_ = p;
    }

    // ---- checkpoint (Exchanger::save_state / load_state; between iterations) ------------------
    /// What load reads and validates before anything changes; restore_state applies it.
    struct saved_state {
      std::vector<float> hist, norms;
      std::vector<std::uint32_t> cur, last;  // full partitions: selected ascending, then the others
      std::size_t ncur = 0, nlast = 0;
      float momentum = default_momentum;
      std::uint64_t warmup = default_warmup, ramp = default_ramp;
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
      if (!(s.momentum >= 0.0f && s.momentum <= 1.0f)) r.fail("momentum", "the checkpoint's CSC momentum " + std::to_string(s.momentum) + " is outside [0, 1].");
      s.warmup = r.u64("warmup");
      s.ramp = r.u64("ramp");
      if (s.ramp > plan::csc_schedule::max_ramp) r.fail("ramp", "the checkpoint's CSC ramp of " + std::to_string(s.ramp) + " iterations is out of range.");
      s.percent = r.u32("percent");
      if (s.percent == 0 || s.percent > 100) r.fail("percent", "the checkpoint's CSC percent " + std::to_string(s.percent) + " is outside (0, 100].");
      s.ncur = static_cast<std::size_t>(r.u64("the selection size"));
      if (s.ncur == 0 || s.ncur > nc)
        r.fail("selection", "the checkpoint selects " + std::to_string(s.ncur) + " chunks of " + std::to_string(nc) + " (at least 1 is always selected).");
      r.array_exact(s.cur, nc, "the selection");
      check_partition(r, s.cur, s.ncur, "selection");
      s.nlast = static_cast<std::size_t>(r.u64("the last selection size"));
      if (s.nlast > nc)
        r.fail("selected_chunks", "the checkpoint's last selection holds " + std::to_string(s.nlast) + " chunks of " + std::to_string(nc) + ".");
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
          r.fail(what, std::string("the checkpoint's chunk list '") + what + "' is not a partition of the " + std::to_string(nc) +
                           " chunks into two ascending runs (entry " + std::to_string(j) + " is chunk " + std::to_string(c) + ").");
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
        throw usage_error(what, "called in the middle of an iteration (after " + std::to_string(next_bucket_) + " buckets were exchanged).",
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
    float momentum_ = default_momentum;
    std::uint64_t warmup_ = default_warmup;
    std::uint64_t ramp_ = default_ramp;
    unsigned percent_ = Percent;
  };
};

static_assert(sparsifier_policy<Sparsifier<CSC<>>>);
static_assert(sparsifier_policy<Sparsifier<CSC<32768, 15>>>);
static_assert(!Sparsifier<CSC<>>::dense);
// CSC's engine meets gflow::detail::sparsifier_engine (detail/concepts.hpp), fp32 and 16-bit wires.
static_assert(detail::sparsifier_engine<CSC<8, 25>::engine<detail::archetype_context<>>, detail::archetype_context<>> &&
                  detail::sparsifier_engine<CSC<8, 25>::engine<detail::archetype_context<half>>, detail::archetype_context<half>> &&
                  detail::counts_collectives<CSC<8, 25>::engine<detail::archetype_context<>>>,
              "gflow::CSC::engine must meet gflow::detail::sparsifier_engine");

}  // namespace gflow
