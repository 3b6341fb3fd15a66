// bench/run kernels --device: the exchanger's CUDA kernels in GB/s against a plain copy kernel
// measured in the same run, and the device top-k against torch.topk (bench/torch_topk.py, when
// Python's torch imports). One JSON object per line on stdout, a table on stderr.
//
//   gflow_bench_device [--n ELEMENTS] [--reps R] [--torch-json FILE]
//
// Bytes counted per kernel: each input read once and each output written once (the floor). Times
// are medians of R runs timed with CUDA events, after a warm-up; inputs are random (never zeros),
// and each kernel's output is checked against the host kernel on a sample before it is timed.
// layering: cuda/ and kernels/: this benchmark times the CUDA kernels themselves and checks them
// against the host kernels.
#include <cuda_runtime.h>

#include <gflow/detail/cuda/cast.cuh>
#include <gflow/detail/cuda/oktopk.cuh>
#include <gflow/detail/cuda/sparse_chunks.cuh>
#include <gflow/detail/cuda/topk.cuh>
#include <gflow/detail/cuda/topk_engine.cuh>
#include <gflow/detail/kernels/cast.hpp>
#include <gflow/detail/kernels/topk.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gflow_bench_device: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* dalloc(std::size_t n) {
  void* p = nullptr;
  ok(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

__global__ void copy_kernel(const float4* __restrict__ in, float4* __restrict__ out, std::size_t n4) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n4; i += std::size_t{gridDim.x} * blockDim.x) out[i] = in[i];
}

/// Median of `reps` timings of fn (milliseconds), after 3 warm-up runs.
double median_ms(const std::function<void()>& fn, int reps, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) fn();
  ok(cudaStreamSynchronize(s), "warm-up");
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a, s), "record");
    fn();
    ok(cudaEventRecord(b, s), "record");
    ok(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  ok(cudaGetLastError(), "a timed launch");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct row {
  std::string name;
  double bytes;
  double ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 25'600'000;
  int reps = 50;
  std::string torch_json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) n = std::stoull(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--torch-json" && i + 1 < argc) torch_json = argv[++i];
    else if (a == "--device" || a == "kernels") continue;
    else {
      std::fprintf(stderr, "usage: gflow_bench_device [--n ELEMENTS] [--reps R] [--torch-json FILE]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gflow_bench_device: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "cudaStreamCreate");

  // Random inputs, a spread of magnitudes.
  std::vector<float> h(n);
  std::mt19937_64 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : h) x = nd(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 16));
  float* a = dalloc<float>(n);
  float* b = dalloc<float>(n);
  float* c = dalloc<float>(n);
  gflow::half* w16 = dalloc<gflow::half>(n);
  gflow::bfloat16* wb = dalloc<gflow::bfloat16>(n);
  unsigned long long* counter = dalloc<unsigned long long>(1);
  ok(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  ok(cudaMemcpy(b, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  ok(cudaMemset(counter, 0, sizeof *counter), "memset");

  // A sample check of the timed kernels against the host ones (scale_to_wire fp16).
  {
    gflow::detail::cuda::scale_to_wire(a, w16, n, 0.25f, s);
    std::vector<gflow::half> got(4096), want(4096);
    ok(cudaMemcpy(got.data(), w16, 4096 * sizeof(gflow::half), cudaMemcpyDeviceToHost), "D2H");
    gflow::detail::kernels::scale_to_wire(h.data(), want.data(), 4096, 0.25f);
    if (std::memcmp(got.data(), want.data(), 4096 * sizeof(gflow::half)) != 0) {
      std::fprintf(stderr, "gflow_bench_device: scale_to_wire<fp16> differs from the host kernel\n");
      return 1;
    }
  }

  const double f4 = sizeof(float), f2 = 2;
  const std::size_t C = 32768, chunks = (n + C - 1) / C;
  std::vector<std::uint32_t> all(chunks);
  std::iota(all.begin(), all.end(), 0u);
  std::uint32_t* list = dalloc<std::uint32_t>(chunks);
  ok(cudaMemcpy(list, all.data(), chunks * 4, cudaMemcpyHostToDevice), "H2D");
  float* norms = dalloc<float>(chunks);
  const std::size_t sel = chunks / 10 ? chunks / 10 : 1;  // 10% of the chunks compacted

  std::vector<row> rows;
  const unsigned grid = static_cast<unsigned>(std::min<std::size_t>((n / 4 + 255) / 256, 4096));
  auto time = [&](const std::string& name, double bytes, const std::function<void()>& fn) { rows.push_back({name, bytes, median_ms(fn, reps, s)}); };
  time("copy (baseline)", 2 * f4 * n, [&] { copy_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(a), reinterpret_cast<float4*>(c), n / 4); });
  time("scale_to_wire fp16", (f4 + f2) * n, [&] { gflow::detail::cuda::scale_to_wire(a, w16, n, 0.25f, s); });
  time("scale_to_wire bf16", (f4 + f2) * n, [&] { gflow::detail::cuda::scale_to_wire(a, wb, n, 0.25f, s); });
  time("wire_to_float fp16 (counts)", (f2 + f4) * n, [&] { gflow::detail::cuda::wire_to_float(w16, c, n, counter, s); });
  time("wire_to_float bf16 (counts)", (f2 + f4) * n, [&] { gflow::detail::cuda::wire_to_float(wb, c, n, counter, s); });
  time("scale_in_place (counts)", 2 * f4 * n, [&] { gflow::detail::cuda::scale_in_place(c, n, 1.0f, counter, s); });
  time("count_nonfinite", f4 * n, [&] { gflow::detail::cuda::count_nonfinite(a, n, counter, s); });
  time("chunk_l1_norms (tree order)", f4 * n, [&] { gflow::detail::cuda::chunk_l1_norms(a, n, C, list, chunks, norms, 1.0f, s); });
  time("defer_chunks_exact (fused norms)", 4 * f4 * n, [&] { gflow::detail::cuda::defer_chunks_exact(c, b, n, C, list, chunks, 1.0f, norms, s); });
  time("scatter_chunks_counted (fused norms)", 2 * f4 * n, [&] { gflow::detail::cuda::scatter_chunks_counted(a, c, n, C, list, chunks, true, 0.5f, norms, 1.0f, counter, s); });
  time("residual: accumulate_into_residual", 3 * f4 * n, [&] { gflow::detail::cuda::accumulate_into_residual(a, b, n, s); });
  time("compact_chunks 10% (fp32)", 3 * f4 * double(sel * C) + f4 * double(sel * C), [&] { gflow::detail::cuda::compact_chunks(a, b, n, C, list, sel, c, s); });
  time("compact_chunks_to_wire 10% (fp16)", (3 * f4 + f2) * double(sel * C), [&] { gflow::detail::cuda::compact_chunks_to_wire(a, b, n, C, list, sel, w16, 0.25f, 4.0f, s); });

  const double copy_gbs = rows[0].bytes / (rows[0].ms * 1e6);
  std::fprintf(stderr, "device: %s, n = %zu fp32, median of %d\n", prop.name, n, reps);
  std::fprintf(stderr, "%-44s %10s %10s %8s\n", "kernel", "us", "GB/s", "vs copy");
  for (const auto& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e6);
    std::fprintf(stderr, "%-44s %10.1f %10.1f %8.2f\n", r.name.c_str(), r.ms * 1e3, gbs, gbs / copy_gbs);
    std::printf("{\"suite\":\"kernels_device\",\"device\":\"%s\",\"kernel\":\"%s\",\"n\":%zu,\"us\":%.3f,\"gbs\":%.2f,\"vs_copy\":%.4f}\n", prop.name,
                r.name.c_str(), n, r.ms * 1e3, gbs, gbs / copy_gbs);
  }

  // Top-k of n fp32 at d = 0.001 and 0.01 (the exchanger's selection: exact, ties to the lower index).
  std::vector<std::pair<double, double>> torch;  // density, us
  if (!torch_json.empty()) {
    std::ifstream in(torch_json);
    std::string line;
    while (std::getline(in, line)) {
      double d = 0, us = 0;
      if (std::sscanf(line.c_str(), "{\"density\": %lf, \"us\": %lf", &d, &us) == 2) torch.push_back({d, us});
    }
  }
  gflow::detail::cuda::topk_selector selector(n);
  for (double d : {0.001, 0.01}) {
    const std::size_t k = static_cast<std::size_t>(std::ceil(d * static_cast<double>(n)));
    std::uint32_t* out = dalloc<std::uint32_t>(k);
    const auto before = selector.paths();
    const double ms = median_ms([&] { selector.select(a, n, k, 0, out, s); }, reps, s);
    const char* path = selector.paths().candidates > before.candidates ? (selector.paths().full > before.full ? "mixed" : "candidates") : "full";
    // Check: the selection equals the host's.
    std::vector<std::uint32_t> got(k), want(k), scratch(n);
    ok(cudaMemcpy(got.data(), out, k * 4, cudaMemcpyDeviceToHost), "D2H");
    gflow::detail::kernels::select_topk(h.data(), n, k, 0, want.data(), scratch.data());
    const bool same = got == want;
    double tus = 0;
    for (auto& [td, t] : torch)
      if (std::fabs(td - d) < 1e-12) tus = t;
    std::fprintf(stderr, "top-k n=%zu d=%g k=%zu: %.1f us, %s path%s%s\n", n, d, k, ms * 1e3, path, same ? "" : "  SELECTION DIFFERS FROM HOST",
                 tus > 0 ? (" (torch.topk " + std::to_string(tus) + " us, x" + std::to_string(tus / (ms * 1e3)) + ")").c_str() : " (torch.topk: not measured)");
    std::printf("{\"suite\":\"kernels_device\",\"device\":\"%s\",\"kernel\":\"topk\",\"n\":%zu,\"density\":%g,\"k\":%zu,\"us\":%.3f,\"path\":\"%s\",\"equal_to_host\":%s,\"torch_us\":%s}\n",
                prop.name, n, d, k, ms * 1e3, path, same ? "true" : "false", tus > 0 ? std::to_string(tus).c_str() : "null");
    cudaFree(out);
    if (!same) return 1;
  }

  // OkTopK's threshold selection (Sparsifier<OkTopK<d>> between re-estimations): G = g + res into
  // res, and the positions and keys of |G| >= its threshold, in index order, one call. g is all
  // zeros so that res (and the count) stay the same over the repetitions; the threshold is the
  // host's 2k-th largest key at d = 0.001, i.e. about capacity x k = 2k gathered.
  {
    const std::size_t k = static_cast<std::size_t>(std::ceil(0.001 * static_cast<double>(n)));
    std::vector<std::uint32_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = gflow::detail::kernels::magnitude_key(h[i]);
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(2 * k - 1), keys.end(), std::greater<std::uint32_t>());
    const std::uint32_t t = std::max<std::uint32_t>(keys[2 * k - 1], 1u);
    const std::size_t cap = 4 * 2 * k;
    std::uint64_t* pos = dalloc<std::uint64_t>(cap);
    std::uint32_t* gk = dalloc<std::uint32_t>(cap);
    ok(cudaMemset(c, 0, n * sizeof(float)), "memset");  // g = +0
    ok(cudaMemcpy(b, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");  // res = the inputs (the kernels above changed b)
    gflow::detail::cuda::threshold_gatherer tg(n);
    std::size_t got = 0;
    const double ms = median_ms([&] { got = tg.gather(c, b, n, t, 0, pos, gk, cap, s); }, reps, s);
    std::size_t want = 0;
    for (std::size_t i = 0; i < n; ++i) want += gflow::detail::kernels::magnitude_key(h[i]) >= t;
    // bytes: read g and res, write res (the host's one pass), read res again where a tile gathers
    const double bytes = 4 * f4 * n, gbs = bytes / (ms * 1e6);
    std::fprintf(stderr, "%-44s %10.1f %10.1f %8.2f  (%zu gathered, host %zu)\n", "oktopk accumulate_gather_above (2k of 25.6M)", ms * 1e3, gbs,
                 gbs / copy_gbs, got, want);
    std::printf("{\"suite\":\"kernels_device\",\"device\":\"%s\",\"kernel\":\"oktopk_gather_above\",\"n\":%zu,\"us\":%.3f,\"gbs\":%.2f,\"vs_copy\":%.4f,"
                "\"gathered\":%zu,\"equal_to_host\":%s}\n",
                prop.name, n, ms * 1e3, gbs, gbs / copy_gbs, got, got == want ? "true" : "false");
    cudaFree(pos);
    cudaFree(gk);
    if (got != want) return 1;
  }
  return 0;
}
