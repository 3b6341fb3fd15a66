// gflow_bench_exchange_device [--layout NAME] [--ranks P] [--iters R] [--transport inproc|mpi]: one
// iteration of each sparse scheme on device memory (the exchanger's CUDA path), P ranks as threads
// on one GPU through gflow::inproc_device::transport, or (--transport mpi, under mpiexec -n P;
// --ranks is then the job's size) one process per rank through gflow::mpi_device::transport, each
// rank on device gflow::mpi_device::local_device (default P = 1: no peer, so what is timed is the engine's own
// work on the device and host: selection, take, the host steps and transfers of OkTopK, the
// merges and verdicts of GTopK, and the pool writes). GTopK is the baseline measured in the
// same run (Dense is not timed: this test transport copies a dense buffer through the host, which
// NCCL does not). Gradients are copied into the pool from a device buffer before each iteration
// (not timed); the timed region is ready() for every tensor and finish() (which synchronises).
// Median and p10 / p90 of R iterations after 5 warm-ups, interleaved scheme by scheme within
// each round so that a drift of the machine moves every scheme alike. Each exchanger records a
// gflow::timeline: the table splits an iteration into the selection (the engines' "select" span:
// selection and take; OkTopK's includes its transfers to the host), the exchange ("collective":
// GTopK's tree and broadcast, TopK's gather, OkTopK's host steps and staged collectives) and the
// rest (applying the result, finish()). One JSON object per scheme on stdout, a table on stderr.
// layering: cuda/: a device exchanger needs <gflow/cuda/exchanger.cuh> and the device transports.
#include <cuda_runtime.h>

#include <gflow/cuda/exchanger.cuh>
#include <gflow/cuda/inproc_transport.cuh>
#if GFLOW_BENCH_HAVE_MPI
#include <gflow/cuda/mpi_transport.cuh>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gflow_bench_exchange_device: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class Sparsifier, class T>
using ex_of = typename gflow::Exchanger<Sparsifier>::template on<T>;

struct scheme {
  std::string name;
  std::vector<double> ms;  // rank 0's iterations
  std::vector<double> select_ms, exchange_ms;  // rank 0's, per iteration: the timeline's select and collective spans
};

// One rank's exchanger of one scheme, type-erased for the round-robin below.
struct runner {
  virtual ~runner() = default;
  virtual float* pool() = 0;
  virtual void iteration() = 0;
  gflow::timeline tl{std::size_t{1} << 17};
};
template <class Ex>
struct runner_of final : runner {
  Ex ex;
  template <class T>
  runner_of(T& t, const gflow::Layout& l) : ex(t, l) {
    ex.set_timeline(&tl);
    tl.start(t);
  }
  float* pool() override { return ex.pool_data(); }
  void iteration() override {
    for (std::size_t k = ex.layout().size(); k-- > 0;) ex.ready(k);
    (void)ex.finish();
  }
};

// The sum of the spans of kind k in each iteration from `first` on.
std::vector<double> spans(const gflow::timeline& tl, gflow::trace_kind k, std::uint64_t first, std::uint64_t count) {
  std::vector<double> out(count, 0.0);
  for (std::size_t i = 0; i < tl.size(); ++i) {
    const auto& e = tl[i];
    if (e.kind == k && e.iteration >= first && e.iteration < first + count)
      out[e.iteration - first] += static_cast<double>(e.end_ns - e.begin_ns) / 1e6;
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double x = p * static_cast<double>(v.size() - 1);
  const std::size_t i = static_cast<std::size_t>(x);
  return i + 1 < v.size() ? v[i] + (x - static_cast<double>(i)) * (v[i + 1] - v[i]) : v[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string layout_name = "resnet50";
  int P = 1, iters = 30;
  std::string via = "inproc";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layout" && i + 1 < argc) layout_name = argv[++i];
    else if (a == "--transport" && i + 1 < argc) via = argv[++i];
    else if (a == "--ranks" && i + 1 < argc) P = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gflow_bench_exchange_device [--layout NAME] [--ranks P] [--iters R] [--transport inproc|mpi]\n");
      return 2;
    }
  }
  if (via != "inproc" && via != "mpi") {
    std::fprintf(stderr, "gflow_bench_exchange_device: --transport is inproc or mpi (got %s)\n", via.c_str());
    return 2;
  }
#if GFLOW_BENCH_HAVE_MPI
  std::unique_ptr<gflow::mpi::environment> env;
  if (via == "mpi") {
    env = std::make_unique<gflow::mpi::environment>(argc, argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
  }
#else
  if (via == "mpi") {
    std::fprintf(stderr, "gflow_bench_exchange_device: built without MPI, so --transport mpi is not available\n");
    return 2;
  }
#endif
  if (P < 1 || iters < 1) {
    std::fprintf(stderr, "gflow_bench_exchange_device: --ranks and --iters must be >= 1\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gflow_bench_exchange_device: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::string path = layout_name.find('/') != std::string::npos ? layout_name : std::string(GFLOW_LAYOUT_DIR) + "/" + layout_name + ".tsv";
  const gflow::Layout layout = gflow::Layout::from_tsv(path);
  const std::size_t n = layout.total_numel();

  std::vector<scheme> schemes = {{"GTopK 0.001", {}}, {"TopK 0.001", {}}, {"OkTopK 0.001", {}}};
  int my_rank = 0;
  auto body = [&]<class T>(T& t) {
    // Each rank's gradients: a spread of magnitudes, fresh per rank, kept on the device.
    std::vector<float> h(n);
    std::mt19937_64 rng(17 + static_cast<unsigned>(t.rank()));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : h) x = nd(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 12));
    float* grads = nullptr;
    ok(cudaMalloc(&grads, n * sizeof(float)), "cudaMalloc");
    ok(cudaMemcpy(grads, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
    std::vector<std::unique_ptr<runner>> rs;
    rs.push_back(std::make_unique<runner_of<ex_of<gflow::Sparsifier<gflow::GTopK<0.001>>, T>>>(t, layout));
    rs.push_back(std::make_unique<runner_of<ex_of<gflow::Sparsifier<gflow::TopK<0.001>>, T>>>(t, layout));
    rs.push_back(std::make_unique<runner_of<ex_of<gflow::Sparsifier<gflow::OkTopK<0.001>>, T>>>(t, layout));
    for (int it = -5; it < iters; ++it) {
      for (std::size_t s = 0; s < rs.size(); ++s) {
        ok(cudaMemcpyAsync(rs[s]->pool(), grads, n * sizeof(float), cudaMemcpyDeviceToDevice, t.stream()), "D2D of the gradients");
        ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
        t.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        rs[s]->iteration();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (it >= 0 && t.rank() == 0) schemes[s].ms.push_back(ms);
      }
      if (t.rank() == 0 && (it + 1) % 10 == 0) std::fprintf(stderr, "  %d of %d rounds\n", it + 1, iters);
    }
    if (t.rank() == 0)
      for (std::size_t s = 0; s < rs.size(); ++s) {
        if (rs[s]->tl.dropped() != 0) std::fprintf(stderr, "  %s: %zu timeline events dropped\n", schemes[s].name.c_str(), rs[s]->tl.dropped());
        schemes[s].select_ms = spans(rs[s]->tl, gflow::trace_kind::select, 5, static_cast<std::uint64_t>(iters));
        schemes[s].exchange_ms = spans(rs[s]->tl, gflow::trace_kind::collective, 5, static_cast<std::uint64_t>(iters));
      }
    ok(cudaFree(grads), "cudaFree");
  };
#if GFLOW_BENCH_HAVE_MPI
  if (via == "mpi") {
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    gflow::mpi_device::transport t(MPI_COMM_WORLD, gflow::mpi_device::local_device(MPI_COMM_WORLD));
    ok(cudaSetDevice(t.device()), "cudaSetDevice");
    body(t);
  }
#endif
  if (via == "inproc") gflow::inproc_device::run(P, [&](gflow::inproc_device::transport& t) { body(t); });
  if (my_rank != 0) return 0;  // rank 0 reports

  const char* how = via == "mpi" ? "processes under mpiexec, mpi_device" : "threads, inproc_device";
  std::fprintf(stderr, "device: %s, layout %s (%zu fp32), %d rank(s) on one GPU (%s), %d iterations\n", prop.name, layout_name.c_str(), n, P, how,
               iters);
  std::fprintf(stderr, "%-16s %10s %10s %10s %10s %10s %10s\n", "scheme", "median ms", "p10", "p90", "vs GTopK", "select", "exchange");
  const double base = percentile(schemes[0].ms, 0.5);
  for (const auto& s : schemes) {
    const double med = percentile(s.ms, 0.5);
    const double sel = percentile(s.select_ms, 0.5), exch = percentile(s.exchange_ms, 0.5);
    std::fprintf(stderr, "%-16s %10.3f %10.3f %10.3f %10.2f %10.3f %10.3f\n", s.name.c_str(), med, percentile(s.ms, 0.1), percentile(s.ms, 0.9),
                 med / base, sel, exch);
    std::printf("{\"suite\":\"exchange_device\",\"device\":\"%s\",\"transport\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,\"scheme\":\"%s\",\"median_ms\":%.4f,\"p10_ms\":%.4f,"
                "\"p90_ms\":%.4f,\"vs_gtopk\":%.4f,\"select_ms\":%.4f,\"exchange_ms\":%.4f}\n",
                prop.name, via.c_str(), layout_name.c_str(), P, s.name.c_str(), med, percentile(s.ms, 0.1), percentile(s.ms, 0.9), med / base, sel, exch);
  }
  return 0;
}
