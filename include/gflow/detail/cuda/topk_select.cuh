#pragma once
// The exact top-k selection on the device (the twin of kernels::select_topk, same indices):
// gflow::detail::cuda::topk_selector. Its kernels, and the device helpers the other top-k kernels share
// (magnitude keys, sanitize, round-to-nearest arithmetic), are in cuda/topk_radix.cuh.
// (cuda/topk.cuh includes it with the rest of the top-k kernels; include that one.)
//
// Selection: the toolkit's CCCL 3.0.1 has no cub::DeviceTopK (it arrives in CCCL 3.2), so this is
// a radix select of our own, the same algorithm as the host reference: the |v| keys
// (bits & 0x7fffffff, NaN above inf) are histogrammed on 12 + 10 + 10 bit digits, most
// significant first (one pass over all n per digit, shared-memory histograms, one atomic per bin
// and block), and a one-block kernel picks each digit with a cub::BlockScan over the bins, so the
// threshold key T and the number `take` of elements equal to T to keep never go back to the host.
// The selected indices are then written in index order at their exact positions
// (#{key > T before i} + min(#{key == T before i}, take)) from per-tile counts scanned with
// cub::DeviceScan and cub::BlockScan: deterministic, no atomics in the output, no sort. Cost:
// five reads of the keys for 3 digit passes, the count and the write pass. A single selection
// handles up to 2^32 - 1 elements (its counts are 32-bit); larger units raise invalid_argument.
//
// Candidates first (select() on large units, n >= 2^20 and k <= n / 64): one block histograms the
// top 12 key bits of 65536 evenly spaced samples and picks the lowest bin edge `lo` above which
// about twice the expected share of k (plus 32) samples lie; the count pass (the one above, with
// the threshold lo - 1) counts the elements with key >= lo, and that count comes to the host (one
// stream synchronisation). If it lies in [k, capacity] (capacity max(8k + 256 n / 65536, n / 64)), the write
// pass gathers those candidates (positions and keys, in index order) and the radix select runs
// on the candidates alone: every element of the top k is one of them, so the result is the same
// indices. Two reads of the keys instead of five. Otherwise (a sample that missed, or keys too
// concentrated for 12 bits to separate: many ties, zeros) the full selection above runs as well.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "../../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "memory.cuh"
#include "topk_radix.cuh"

namespace gflow::detail::cuda {

/// Exact top-k selection on the device (see the header comment). Owns its scratch, sized for
/// units of up to max_n elements; select() enqueues work only.
class topk_selector {
 public:
  explicit topk_selector(std::size_t max_n) : max_n_(max_n) {
    if (max_n > std::numeric_limits<unsigned>::max())
      throw invalid_argument("max_n", fmt::format("a device top-k selection handles at most 2^32 - 1 elements (got {}).", max_n),
                             "select over smaller units (Fusion buckets).");
    state_ = device_array<topk_detail::select_state>(1, "cudaMalloc of the top-k selection state");
    hist_ = device_array<unsigned>(4096, "cudaMalloc of the top-k histogram");
    // Zeroed once here (the choose kernel clears it after each use), and waited for: the work that
    // reads it runs on non-blocking streams, which do not wait for the legacy default stream.
    check_cuda(cudaMemsetAsync(hist_.get(), 0, 4096 * sizeof(unsigned), 0), "cudaMemsetAsync of the top-k histogram");
    check_cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize after zeroing the top-k histogram");
    const std::size_t tiles = topk_detail::tiles_for(max_n ? max_n : 1);
    counts_ = device_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile counts");
    offsets_ = device_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile offsets");
    std::size_t bytes = 0;
    check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles)),
               "cub::DeviceScan::ExclusiveSum size query");
    temp_ = device_array<unsigned char>(bytes, "cudaMalloc of the top-k scan scratch");
    temp_bytes_ = bytes;
    void* h = nullptr;
    check_cuda(cudaMallocHost(&h, 2 * sizeof(unsigned long long)), "cudaMallocHost of the top-k candidate count");
    host_.reset(static_cast<unsigned long long*>(h));
  }

  [[nodiscard]] std::size_t max_n() const noexcept { return max_n_; }

  /// How select() ran so far: through the candidates, or the full selection (small units, large
  /// k, or candidates out of [k, capacity]). The result is the same either way.
  struct path_counts {
    std::size_t candidates = 0, full = 0;
  };
  [[nodiscard]] path_counts paths() const noexcept { return paths_; }

  /// Writes base + position of the min(k, n) largest |v[0, n)| to out, increasing; ties to the
  /// lower index. Device pointers; enqueued on `stream`, except that on large units the candidate
  /// count comes to the host first (one synchronisation of `stream`; see the header).
  template <class I>
  void select(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, cudaStream_t stream) {
    check_n(n);
    if (n == 0 || k == 0) return;
    if (k >= n) {
      kernel_detail::launch(topk_detail::iota_kernel<I>, topk_detail::blocks_for(n), topk_detail::threads, stream,
                            "launch of gflow::detail::cuda::topk_selector (k >= n)", out, n, base);
      return;
    }
    if (n >= min_sampled_n && k <= n / 64 && select_candidates(v, n, k, base, out, stream)) {
      ++paths_.candidates;
      return;
    }
    ++paths_.full;
    run(topk_detail::float_keys{v}, n, nullptr, k, topk_detail::emit_index<I>{out, base}, stream);
  }

  /// The selection on precomputed keys with a device-side count (*d_n <= n_max): what the
  /// merge uses. emit(i, selected, position) is called for every element below *d_n.
  template <class Keys, class Emit>
  void run(Keys keys, std::size_t n_max, const unsigned* d_n, std::size_t k, Emit emit, cudaStream_t stream) {
    check_n(n_max);
    if (n_max == 0) return;
    using namespace topk_detail;
    digit_pass<0>(keys, n_max, d_n, k, stream);
    digit_pass<1>(keys, n_max, d_n, k, stream);
    digit_pass<2>(keys, n_max, d_n, k, stream);
    const unsigned tiles = tiles_for(n_max);
    kernel_detail::launch(count_kernel<Keys>, tiles, threads, stream, "launch of the gflow::detail::cuda::topk_selector count pass", keys, n_max, d_n,
                          state_.get(), counts_.get());
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles), stream),
               "cub::DeviceScan::ExclusiveSum of the top-k tile counts");
    kernel_detail::launch(write_kernel<Keys, Emit>, tiles, threads, stream, "launch of the gflow::detail::cuda::topk_selector write pass", keys, n_max, d_n,
                          state_.get(), offsets_.get(), emit);
  }

 private:
  static constexpr std::size_t min_sampled_n = std::size_t{1} << 20;
  static constexpr unsigned samples = 65536;

  // The candidates path (see the header); false when the count is outside [k, capacity] (nothing
  // was written to out, the full selection must run).
  template <class I>
  bool select_candidates(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, cudaStream_t stream) {
    using namespace topk_detail;
    const unsigned expect = static_cast<unsigned>((static_cast<unsigned long long>(k) * samples + n - 1) / n);
    const unsigned want = 2 * expect + 32;
    // Room for the candidates: about 4 x what `want` asks for, at least n / 64 (12-bit bins can
    // hold many more elements than the samples in them suggest); only memory, the count decides the cost.
    const std::size_t cap = std::min<std::size_t>(n, std::max<std::size_t>(8 * k + 256 * (n / samples), n / 64));
    const float_keys keys{v};
    kernel_launch_sample(keys, n, want, stream);
    const unsigned tiles = tiles_for(n);
    kernel_detail::launch(count_kernel<float_keys>, tiles, threads, stream, "launch of the gflow::detail::cuda::topk_selector candidate count", keys, n,
                          static_cast<const unsigned*>(nullptr), state_.get(), counts_.get());
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles), stream),
               "cub::DeviceScan::ExclusiveSum of the top-k candidate counts");
    check_cuda(cudaMemcpyAsync(host_.get(), counts_.get() + (tiles - 1), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of the top-k candidate count");
    check_cuda(cudaMemcpyAsync(host_.get() + 1, offsets_.get() + (tiles - 1), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of the top-k candidate offset");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize for the top-k candidate count");
    const std::size_t count = static_cast<std::size_t>((host_.get()[0] >> 32) + (host_.get()[1] >> 32));  // key > lo - 1
    if (count < k || count > cap) return false;
    if (cand_cap_ < cap) {
      cand_pos_ = device_array<unsigned>(cap, "cudaMalloc of the top-k candidate positions");
      cand_key_ = device_array<unsigned>(cap, "cudaMalloc of the top-k candidate keys");
      cand_cap_ = cap;
    }
    kernel_detail::launch(write_kernel<float_keys, emit_candidate>, tiles, threads, stream, "launch of the gflow::detail::cuda::topk_selector candidate write", keys,
                          n, static_cast<const unsigned*>(nullptr), state_.get(), offsets_.get(),
                          emit_candidate{v, cand_pos_.get(), cand_key_.get(), static_cast<unsigned long long>(cap)});
    run(plain_keys{cand_key_.get()}, count, nullptr, k, emit_from_candidates<I>{out, cand_pos_.get(), base}, stream);
    return true;
  }
  template <class Keys>
  void kernel_launch_sample(Keys keys, std::size_t n, unsigned want, cudaStream_t stream) {
    kernel_detail::launch(topk_detail::sample_kernel<Keys>, 1u, topk_detail::choose_threads, stream, "launch of the gflow::detail::cuda::topk_selector sample",
                          keys, n, samples, want, state_.get());
  }

  // Digit D of the threshold: histogram the keys that match the digits chosen so far, then pick.
  template <int D, class Keys>
  void digit_pass(Keys keys, std::size_t n_max, const unsigned* d_n, std::size_t k, cudaStream_t stream) {
    using namespace topk_detail;
    const char* what = "launch of the gflow::detail::cuda::topk_selector radix passes";
    kernel_detail::launch(histogram_kernel<D, Keys>, blocks_for(n_max), threads, stream, what, keys, n_max, d_n, state_.get(), hist_.get());
    kernel_detail::launch(choose_kernel<D>, 1u, choose_threads, stream, what, state_.get(), hist_.get(), k, n_max, d_n);
  }

  void check_n(std::size_t n) const {
    if (n > max_n_)
      throw invalid_argument("n", fmt::format("this topk_selector was sized for {} elements; select() got {}.", max_n_, n),
                             "build the selector with the largest unit it will see.");
  }

  std::size_t max_n_;
  device_array<topk_detail::select_state> state_;
  device_array<unsigned> hist_;
  device_array<unsigned long long> counts_, offsets_;
  device_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
  struct host_free {
    void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
  };
  std::unique_ptr<unsigned long long, host_free> host_;  // the candidate count's tile count and offset (pinned)
  device_array<unsigned> cand_pos_, cand_key_;        // the candidates (built on first use, grown for larger k)
  std::size_t cand_cap_ = 0;
  path_counts paths_{};
};

}  // namespace gflow::detail::cuda
