// bench/run kernels: each host kernel on a model's pool size, against a copy measured in the
// same run. One process (bench/run starts one rank for this suite).
//
// For every kernel: the median time over --iters interleaved rounds (every kernel once per
// round, in a fixed order, so drift in the machine's speed hits all of them alike), the bytes it
// reads and writes, its bandwidth, and two ratios against the copy of the same n floats
// (memcpy, 4n bytes read + 4n written):
//   vs_copy_bw    kernel GB/s / copy GB/s          (the issue-10 target for memory-bound kernels: >= 0.5)
//   x_copy_time   kernel time / copy time          (the target for top-k selection: <= 2)
// layering: kernels/ and plan/density.hpp: this suite times the host kernels themselves.
#include "suites.hpp"

#include <gflow/detail/kernels/cast.hpp>
#include <gflow/detail/kernels/sparse_chunks.hpp>
#include <gflow/detail/kernels/topk.hpp>
#include <gflow/detail/plan/density.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

namespace gflow_bench {

namespace {

struct kernel_case {
  std::string name;
  double bytes;                  // read + written per call
  std::function<void()> prepare;  // untimed: restores the inputs the kernel overwrites
  std::function<void()> run;
  std::vector<double> times;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Gradient-like values: a smooth magnitude spread with a sign pattern, distinct per position.
void fill_gradients(float* v, std::size_t n, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float u = static_cast<float>(x >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    v[i] = (u - 0.5f) * 0.02f;
  }
}

}  // namespace

int run_kernels_suite(const kernels_options& o) {
  using clock = std::chrono::steady_clock;
  constexpr std::size_t chunk = 32768;  // CSC's chunk in bench/run sparse
  constexpr double csc_fraction = 0.15;  // CSC's default percent there

  for (const auto& [layout_name, n] : o.sizes) {
    std::fprintf(stderr, "gflow bench: suite kernels, %s (%zu elements = %.1f MiB of fp32), %d+%d rounds\n", layout_name.c_str(), n,
                 static_cast<double>(n) * 4 / (1 << 20), o.warmup, o.iters);
    std::vector<float> res(n), out(n), fresh(n);
    std::vector<gflow::half> h16(n), h16b(n);
    std::vector<gflow::bfloat16> b16(n), b16b(n);
    std::vector<std::uint32_t> keys(n);
    fill_gradients(fresh.data(), n, 1);
    fill_gradients(res.data(), n, 2);
    gflow::detail::kernels::scale_to_wire(fresh.data(), h16.data(), n, 0.25f);
    gflow::detail::kernels::scale_to_wire(res.data(), h16b.data(), n, 0.25f);
    gflow::detail::kernels::scale_to_wire(fresh.data(), b16.data(), n, 0.25f);
    gflow::detail::kernels::scale_to_wire(res.data(), b16b.data(), n, 0.25f);
    std::vector<float> res0 = res;

    // CSC chunk lists: every chunk (norms), and 15% of them spread over the pool (compaction, scatter).
    const std::size_t chunks = (n + chunk - 1) / chunk;
    std::vector<std::uint32_t> all_chunks(chunks);
    std::iota(all_chunks.begin(), all_chunks.end(), 0u);
    std::vector<std::uint32_t> some;
    const std::size_t picked = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(chunks) * csc_fraction));
    for (std::size_t j = 0; j < picked; ++j) some.push_back(static_cast<std::uint32_t>(j * chunks / picked));
    std::size_t some_elems = 0;
    for (auto c : some) some_elems += std::min(n, (c + 1) * chunk) - c * chunk;
    std::vector<float> norms(chunks), hist(n), compact(some_elems);
    fill_gradients(hist.data(), n, 3);

    std::size_t sink = 0;  // results the compiler must not drop
    const double N = static_cast<double>(n);
    std::vector<kernel_case> ks;
    auto none = [] {};
    ks.push_back({"copy", 8 * N, none, [&] { std::memcpy(out.data(), fresh.data(), n * sizeof(float)); }, {}});
    namespace K = gflow::detail::kernels;
    constexpr auto sum = gflow::reduce_op::sum;
    // The dispatching kernels (AVX2 + F16C where the CPU has them), then the scalar reference twins.
    ks.push_back({"scale_to_fp16", 6 * N, none, [&] { K::scale_to_wire(fresh.data(), h16.data(), n, 0.25f); }, {}});
    ks.push_back({"scale_to_bf16", 6 * N, none, [&] { K::scale_to_wire(fresh.data(), b16.data(), n, 0.25f); }, {}});
    ks.push_back({"widen_fp16+count", 6 * N, none, [&] { sink += K::wire_to_float(h16.data(), out.data(), n); }, {}});
    ks.push_back({"widen_bf16+count", 6 * N, none, [&] { sink += K::wire_to_float(b16.data(), out.data(), n); }, {}});
    ks.push_back({"sum_op_fp16", 6 * N, none, [&] { K::combine_wire<sum>(h16b.data(), h16.data(), n); }, {}});
    ks.push_back({"sum_op_bf16", 6 * N, none, [&] { K::combine_wire<sum>(b16b.data(), b16.data(), n); }, {}});
    ks.push_back({"scale_to_fp16 (reference)", 6 * N, none, [&] { K::reference::scale_to_wire(fresh.data(), h16.data(), n, 0.25f); }, {}});
    ks.push_back({"widen_fp16+count (reference)", 6 * N, none, [&] { sink += K::reference::wire_to_float(h16.data(), out.data(), n); }, {}});
    ks.push_back({"sum_op_fp16 (reference)", 6 * N, none, [&] { K::reference::combine_wire<sum>(h16b.data(), h16.data(), n); }, {}});
    ks.push_back({"scale_in_place+count", 8 * N, [&] { std::memcpy(out.data(), fresh.data(), n * sizeof(float)); },
                  [&] { sink += gflow::detail::kernels::scale_in_place(out.data(), n, 0.25f); }, {}});
    ks.push_back({"scale_in_place+count (reference)", 8 * N, [&] { std::memcpy(out.data(), fresh.data(), n * sizeof(float)); },
                  [&] { sink += gflow::detail::kernels::reference::scale_in_place(out.data(), n, 0.25f); }, {}});
    ks.push_back({"residual_accumulate", 12 * N, [&] { std::memcpy(res.data(), res0.data(), n * sizeof(float)); },
                  [&] { K::accumulate_into_residual(fresh.data(), res.data(), n); }, {}});
    auto ws = std::make_shared<K::topk_workspace>();
    for (double d : {0.001, 0.01}) {
      const std::size_t k = gflow::detail::plan::k_for(d, n);
      ws->reserve(n, k);
      auto idx = std::make_shared<std::vector<std::uint32_t>>(k);
      char name[64];
      // Selection alone (values already accumulated): the sampled one-pass kernel, and the
      // three-pass radix select it replaces (its reference).
      std::snprintf(name, sizeof name, "topk_select_d%g", d);
      ks.push_back({name, 4 * N, none, [&, k, idx, ws] { sink += K::select_topk_sampled(fresh.data(), n, k, 0, idx->data(), *ws).count; }, {}});
      std::snprintf(name, sizeof name, "topk_select_d%g (reference)", d);
      ks.push_back({name, 4 * N, none, [&, k, idx] { sink += K::select_topk(fresh.data(), n, k, 0, idx->data(), keys.data()); }, {}});
      // What a Top-k unit costs before its message is packed: res = g + res, then the selection.
      std::snprintf(name, sizeof name, "topk_accum+select_d%g", d);
      ks.push_back({name, 12 * N, [&] { std::memcpy(res.data(), res0.data(), n * sizeof(float)); },
                    [&, k, idx, ws] { sink += K::accumulate_select_topk(fresh.data(), res.data(), n, k, 0, idx->data(), *ws).count; }, {}});
    }
    ks.push_back({"csc_chunk_norms", 4 * N, none,
                  [&] { gflow::detail::kernels::chunk_l1_norms(fresh.data(), n, chunk, all_chunks.data(), chunks, norms.data()); }, {}});
    const double S = static_cast<double>(some_elems);
    ks.push_back({"csc_compact_15pct", 16 * S, [&] { std::memcpy(hist.data(), res0.data(), n * sizeof(float)); },
                  [&] { sink += gflow::detail::kernels::compact_chunks(fresh.data(), hist.data(), n, chunk, some.data(), some.size(), compact.data()); }, {}});
    ks.push_back({"csc_scatter_15pct+norms", 8 * S, none,
                  [&] { sink += gflow::detail::kernels::scatter_chunks(compact.data(), out.data(), n, chunk, some.data(), some.size(), norms.data(), 1.0f); },
                  {}});

    for (int r = 0; r < o.warmup + o.iters; ++r) {
      for (auto& k : ks) {
        k.prepare();
        const auto t0 = clock::now();
        k.run();
        const double dt = std::chrono::duration<double>(clock::now() - t0).count();
        if (r >= o.warmup) k.times.push_back(dt);
      }
      std::fprintf(stderr, "%s  round %d/%d", isatty(2) ? "\r" : (r ? " " : ""), r + 1, o.warmup + o.iters);
    }
    std::fprintf(stderr, isatty(2) ? "\r%40s\r" : "%s\n", "");
    const double copy_t = median(ks.front().times);
    const double copy_bw = 8 * N / copy_t;
    std::fprintf(stderr, "%-26s %10s %10s %10s %10s %10s %12s\n", "kernel", "median_ms", "min_ms", "max_ms", "GB/s", "vs_copy_bw", "x_copy_time");
    for (auto& k : ks) {
      const double t = median(k.times);
      const double lo = *std::min_element(k.times.begin(), k.times.end());
      const double hi = *std::max_element(k.times.begin(), k.times.end());
      const double bw = k.bytes / t;
      std::fprintf(stderr, "%-26s %10.2f %10.2f %10.2f %10.2f %10.3f %12.3f\n", k.name.c_str(), t * 1e3, lo * 1e3, hi * 1e3, bw / 1e9, bw / copy_bw,
                   t / copy_t);
      std::printf(
          "{\"suite\":\"kernels\",\"layout\":\"%s\",\"elements\":%zu,\"kernel\":\"%s\",\"median_s\":%.9g,\"min_s\":%.9g,\"max_s\":%.9g,"
          "\"bytes\":%.0f,\"gbps\":%.6g,\"vs_copy_bw\":%.6g,\"x_copy_time\":%.6g,\"rounds\":%d}\n",
          layout_name.c_str(), n, k.name.c_str(), t, lo, hi, k.bytes, bw / 1e9, bw / copy_bw, t / copy_t, o.iters);
    }
    std::fflush(stdout);
    if (sink == 42) std::fprintf(stderr, " ");
  }
  return 0;
}

}  // namespace gflow_bench
