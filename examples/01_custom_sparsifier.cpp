// A sparsifier gflow does not ship, written outside include/ against the documented extension point
// (<gflow/extension.hpp>, gflow::sparsifier_engine): random-k with residual
// ("memory"). Every iteration each bucket exchanges the same k random positions on every rank (the
// positions come from a seed, the iteration and the bucket, so no index travels); what is not sent
// stays in the rank's residual and is added to the next iteration's gradient. Only k floats per
// bucket cross the wire, through the context's dense_allreduce: the composition's Topology carries
// them and its Precision casts them (an fp16 wire sends k halves), as for a built-in scheme.
//
// It composes with the other families like a built-in scheme:
//     gflow::Exchanger<gflow::Sparsifier<RandomK<0.05>>, gflow::Fusion<256 << 10>>
// and this program checks on 4 in-process ranks that every rank applies identical bits and that
// nothing is lost: sum over ranks of (gradient + residual before) = P x applied + sum over ranks of
// the residual after, element by element. ctest example.custom_sparsifier runs it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <vector>

// ---- the engine: what gflow calls (gflow::sparsifier_engine, <gflow/extension.hpp>) -------------
// Ctx is gflow's exchange context (gflow::exchange_context; its members and helpers: docs/GUIDE.md):
// the transport, the pool (grads), the bucket plan, the iteration counter, and dense_allreduce(),
// which sums through the Topology in the Precision's wire type and averages.
template <class Ctx, double Density>
class random_k_engine {
  static_assert(std::is_same_v<typename Ctx::transport_type::memory_space, gflow::host_memory>,
                "RandomK (examples/01_custom_sparsifier.cpp) runs on host memory: use it with an MPI or in-process transport.");

 public:
  explicit random_k_engine(Ctx& cx) : cx_(&cx), residual_(cx.pool->total, 0.0f) { replan(); }

  // The buckets changed (set_fusion, learn_order): nothing is cached per bucket but the scratch.
  void replan() {
    std::size_t most = 0;
    for (const auto& b : *cx_->buckets) most = std::max(most, k_of(b.count));
    picked_.resize(most);
    sent_.resize(most);
    wire_.resize(most);  // the wire-type scratch dense_allreduce casts into (unused with an fp32 wire)
  }

  // Bucket b's gradients are final in the pool: add the residual, send k positions, keep the rest.
  void exchange(std::size_t b) {
    const auto& bk = (*cx_->buckets)[b];
    float* g = cx_->grads + bk.offset;
    float* res = residual_.data() + bk.offset;
    const std::size_t n = bk.count, k = k_of(n);
    for (std::size_t j = 0; j < n; ++j) res[j] += g[j];  // the rank's whole gradient, residual included
    pick(b, n, k);
    for (std::size_t j = 0; j < k; ++j) {
      sent_[j] = res[picked_[j]];
      res[picked_[j]] = 0.0f;  // sent: it leaves the residual
    }
    cx_->dense_allreduce(sent_.data(), k, wire_.data());  // sum over ranks, averaged; inf/NaN counted
    std::fill(g, g + n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) g[picked_[j]] = sent_[j];
    bytes_ += k * sizeof(typename Ctx::wire_type);
  }

  void end_iteration() {
    last_bytes_ = bytes_;
    bytes_ = 0;
  }
  [[nodiscard]] std::size_t wire_bytes() const { return last_bytes_; }

  // Checkpoints: the residual is the only state (read validates, restore applies).
  struct saved_state {
    std::vector<float> residual;
  };
  void save_state(gflow::checkpoint_writer& w) const { w.array(residual_.data(), residual_.size()); }
  [[nodiscard]] saved_state read_state(gflow::checkpoint_reader& r) const {
    saved_state s;
    r.array_exact(s.residual, residual_.size(), "the random-k residual");
    return s;
  }
  void restore_state(saved_state&& s) { residual_ = std::move(s.residual); }

  [[nodiscard]] const std::vector<float>& residual() const noexcept { return residual_; }

 private:
  static std::size_t k_of(std::size_t n) { return std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(Density * static_cast<double>(n)))); }

  // k distinct positions of [0, n), the same on every rank: Floyd's sampling from a generator
  // seeded by (iteration, bucket), then sorted.
  void pick(std::size_t b, std::size_t n, std::size_t k) {
    std::mt19937_64 rng(0x9E3779B97F4A7C15ull * (*cx_->iteration + 1) + b);
    std::size_t m = 0;
    for (std::size_t j = n - k; j < n; ++j) {
      const std::size_t t = std::uniform_int_distribution<std::size_t>(0, j)(rng);
      const bool seen = std::find(picked_.begin(), picked_.begin() + static_cast<std::ptrdiff_t>(m), t) != picked_.begin() + static_cast<std::ptrdiff_t>(m);
      picked_[m++] = seen ? j : t;
    }
    std::sort(picked_.begin(), picked_.begin() + static_cast<std::ptrdiff_t>(k));
  }

  Ctx* cx_;
  std::vector<float> residual_;
  std::vector<std::size_t> picked_;
  std::vector<float> sent_;
  std::vector<typename Ctx::wire_type> wire_;
  std::size_t bytes_ = 0, last_bytes_ = 0;
};

// ---- the scheme: what Sparsifier<S> takes --------------------------------------------------------
template <double Density>
struct RandomK {
  static_assert(Density > 0.0 && Density <= 1.0, "RandomK<density>: the density must lie in (0, 1].");
  template <class Ctx>
  using engine = random_k_engine<Ctx, Density>;
};

// Checked where it is defined, over a context that runs nothing (fp32 and fp16 wires).
static_assert(gflow::sparsifier_engine<RandomK<0.05>::engine<gflow::archetype_context<>>, gflow::archetype_context<>>);
static_assert(gflow::sparsifier_engine<RandomK<0.05>::engine<gflow::archetype_context<gflow::half>>, gflow::archetype_context<gflow::half>>);

// ---- use it ---------------------------------------------------------------------------------------
int main() {
  const auto layout = gflow::Layout::from_sizes({4096, 64, 25000, 10, 300});
  using Exchange = gflow::Exchanger<gflow::Sparsifier<RandomK<0.05>>, gflow::Fusion<(16 << 10)>, gflow::Overlap<gflow::Funneled>>;
  constexpr int P = 4, iterations = 5;
  const std::size_t n = layout.total_numel();

  std::mutex mu;
  std::vector<std::vector<float>> applied(P), fed(P), res_before(P), res_after(P);
  std::atomic<bool> ok = true;
  std::atomic<std::size_t> checked = 0;
  gflow::inproc::run(P, [&](gflow::inproc::transport& comm) {
    Exchange::on<gflow::inproc::transport> ex(comm, layout);
    std::mt19937 rng(1234u + static_cast<unsigned>(comm.rank()));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int it = 0; it < iterations; ++it) {
      const std::vector<float> before = ex.sparsifier().residual();
      std::vector<float> g(n);
      for (std::size_t i = layout.size(); i-- > 0;) {  // backward: last tensor first
        for (float& x : ex.view(i)) x = u(rng);
        const auto v = ex.view(i);
        std::copy(v.begin(), v.end(), g.begin() + static_cast<std::ptrdiff_t>(v.data() - ex.pool_data()));
        ex.ready(i);
      }
      const gflow::exchange_status st = ex.finish();
      if (comm.rank() == 0 && it == 0)
        std::printf("random-k 5%%: %zu of %zu bytes per rank on the wire (%zu buckets)\n", st.wire_bytes, n * sizeof(float), ex.buckets().size());
      {
        std::lock_guard lk(mu);
        applied[comm.rank()].assign(ex.pool_data(), ex.pool_data() + n);
        fed[comm.rank()] = g;
        res_before[comm.rank()] = before;
        res_after[comm.rank()] = ex.sparsifier().residual();
      }
      comm.barrier();
      if (comm.rank() == 0) {
        // Identical on every rank, bit for bit.
        for (int r = 1; r < P; ++r)
          if (applied[r] != applied[0]) ok = false;
        // Conserved: what went in is applied (x P) or still held, up to the sums' rounding.
        for (std::size_t j = 0; j < n; ++j) {
          double in = 0, out = P * static_cast<double>(applied[0][j]), mag = 0;
          for (int r = 0; r < P; ++r) {
            in += static_cast<double>(fed[r][j]) + res_before[r][j];
            out += res_after[r][j];
            mag += std::fabs(fed[r][j]) + std::fabs(res_before[r][j]);
          }
          if (std::fabs(in - out) > 1e-5 * (mag + 1.0)) ok = false;
          ++checked;
        }
      }
      comm.barrier();
    }
  });
  std::printf("%zu elements checked over %d iterations: %s\n", checked.load(), iterations,
              ok && checked > 0 ? "identical on every rank, nothing lost" : "WRONG");
  return ok && checked > 0 ? 0 : 1;
}
