// The Exchanger over gflow::mpi::transport: every rank writes rank-dependent pseudo-random
// gradients, marks them ready in its own shuffled order, and after finish() must hold the
// float64 mean of all ranks' gradients within the wire format's rounding bound, bit for bit
// the same on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

namespace {

using Fp32 = gflow::Exchanger<>;
using Fp32Fused = gflow::Exchanger<gflow::Fusion<256>>;
using Fp16Fused = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>>;
using Bf16Fused = gflow::Exchanger<gflow::Fusion<1024, 64>, gflow::Precision<gflow::bfloat16>>;

// Unit roundoff (half an ulp at 1) and the largest rounding error below the normal range.
template <class W> struct wire_traits;
template <> struct wire_traits<float> { static constexpr double u = 0x1p-24, floor = 0x1p-150; };
template <> struct wire_traits<gflow::half> { static constexpr double u = 0x1p-11, floor = 0x1p-25; };
template <> struct wire_traits<gflow::bfloat16> { static constexpr double u = 0x1p-8, floor = 0x1p-134; };

// Per-tensor magnitudes: order 1, and small enough that an fp16 wire (after dividing by P)
// lands in its subnormal range.
constexpr float scales[] = {1.0f, 1e-2f, 1e-4f, 3.0f};

std::uint64_t stream(int rank, int iter, std::size_t tensor) {
  return gflow_test::mix((static_cast<std::uint64_t>(iter) << 40) ^ (static_cast<std::uint64_t>(rank) << 32) ^ tensor);
}
float grad(int rank, int iter, std::size_t tensor, std::size_t j) {
  return scales[tensor % 4] * gflow_test::uniform(stream(rank, iter, tensor), j);
}

gflow::Layout small_layout() { return gflow::Layout::from_sizes({1000, 3, 257, 4096, 1}); }
gflow::Layout resnet50() { return gflow::Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/resnet50.tsv"); }

template <class X>
void fill_and_mark_ready(X& ex, int rank, int iter) {
  std::vector<std::size_t> order(ex.layout().size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 rng(1000003ull * static_cast<std::uint64_t>(rank) + static_cast<std::uint64_t>(iter));
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t i : order) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = grad(rank, iter, i, j);
    ex.ready(i);
  }
}

/// Number of elements farther from the float64 mean than the rounding bound
///   (P + 1) * (u_wire + u_fp32) * mean|g| + 2P * floor
/// (a 16-bit wire rounds each g/P once and each of the P-1 partial sums once, in fp32 and
/// then to the wire type; each of those 2P-1 roundings may be a subnormal one, worth up to
/// `floor`. An fp32 wire rounds the P-1 partial sums and the final scaling). `worst` gets the
/// largest error / bound seen: about 0.3-0.8 in practice, so the bound is tight, not loose.
template <class X>
std::size_t count_off(X& ex, int P, int iter, double& worst) {
  using W = typename X::wire_type;
  const double u = (std::is_same_v<W, float> ? 0.0 : wire_traits<W>::u) + wire_traits<float>::u;
  std::size_t off = 0;
  std::vector<std::uint64_t> seeds(static_cast<std::size_t>(P));
  for (std::size_t i = 0; i < ex.layout().size(); ++i) {
    for (int r = 0; r < P; ++r) seeds[static_cast<std::size_t>(r)] = stream(r, iter, i);
    const float scale = scales[i % 4];
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) {
      double sum = 0, abs = 0;
      for (int r = 0; r < P; ++r) {
        const double g = scale * gflow_test::uniform(seeds[static_cast<std::size_t>(r)], j);
        sum += g;
        abs += std::fabs(g);
      }
      const double mean = sum / P, tol = (P + 1) * u * (abs / P) * 1.01 + 2 * P * wire_traits<W>::floor;
      const double err = std::fabs(static_cast<double>(v[j]) - mean);
      if (!(err <= tol)) ++off;
      if (tol > 0 && err / tol > worst) worst = err / tol;
    }
  }
  return off;
}

template <class X>
void run_iterations(const gflow::Layout& layout, int iterations) {
  gflow::mpi::transport t;
  X ex(t, layout);
  const int P = t.size(), r = t.rank();
  for (int it = 0; it < iterations; ++it) {
    CAPTURE(it);
    fill_and_mark_ready(ex, r, it);
    const gflow::exchange_status st = ex.finish();
    CHECK(st.iteration == static_cast<std::uint64_t>(it));
    CHECK(st.finite());
    CHECK(st.collectives == ex.buckets().size());
    double worst = 0;
    CHECK(count_off(ex, P, it, worst) == 0);
    CHECK(worst <= 1.0);
    // Bitwise identical on every rank.
    const std::uint64_t h = gflow_test::hash_bytes(ex.pool_data(), ex.pool_size() * sizeof(float));
    CHECK(gflow_test::same_on_all_ranks(t, h));
    CHECK(gflow_test::same_on_all_ranks(t, st.nonfinite));
  }
}

}  // namespace

#define GFLOW_MPI_COMPOSITIONS Fp32, Fp32Fused, Fp16Fused, Bf16Fused

TEST_CASE_TEMPLATE("mpi exchanger: mean of shuffled-ready gradients, small layout", E, GFLOW_MPI_COMPOSITIONS) {
  run_iterations<typename E::template on<gflow::mpi::transport>>(small_layout(), 4);
}

TEST_CASE_TEMPLATE("mpi exchanger: mean of shuffled-ready gradients, resnet50 layout", E, GFLOW_MPI_COMPOSITIONS) {
  run_iterations<typename E::template on<gflow::mpi::transport>>(resnet50(), 2);
}

TEST_CASE_TEMPLATE("mpi exchanger: inf on one rank is reported on every rank", E, Fp32, Fp32Fused, Fp16Fused, Bf16Fused) {
  using X = typename E::template on<gflow::mpi::transport>;
  gflow::mpi::transport t;
  X ex(t, small_layout());
  const int P = t.size(), r = t.rank();

  fill_and_mark_ready(ex, r, 0);
  (void)ex.finish();

  // Iteration 1: the last rank writes +inf into one element of tensor 2.
  std::vector<std::size_t> order(ex.layout().size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::reverse(order.begin(), order.end());
  for (std::size_t i : order) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = grad(r, 1, i, j);
    if (r == P - 1 && i == 2) v[5] = std::numeric_limits<float>::infinity();
    ex.ready(i);
  }
  const auto st = ex.finish();
  CHECK(st.nonfinite == 1);
  CHECK_FALSE(st.finite());
  CHECK(ex.view(2)[5] == std::numeric_limits<float>::infinity());
  CHECK(gflow_test::same_on_all_ranks(t, st.nonfinite));

  // The next iteration is clean again: nothing non-finite lingers.
  fill_and_mark_ready(ex, r, 2);
  const auto st2 = ex.finish();
  CHECK(st2.finite());
  double worst = 0;
  CHECK(count_off(ex, P, 2, worst) == 0);
}

TEST_CASE("mpi exchanger: fp16 divides before it casts") {
  using X = Fp16Fused::on<gflow::mpi::transport>;
  gflow::mpi::transport t;
  X ex(t, small_layout());

  // 60000 on every rank: the fp16 sum of the raw values would overflow (max 65504), but each
  // rank sends 60000 / P, so the average comes back exactly and finite.
  for (std::size_t i = 0; i < ex.layout().size(); ++i) {
    auto v = ex.view(i);
    std::fill(v.begin(), v.end(), 60000.0f);
    ex.ready(i);
  }
  const auto st = ex.finish();
  CHECK(st.finite());
  const float* p = ex.pool_data();
  CHECK(std::all_of(p, p + ex.pool_size(), [](float x) { return x == 60000.0f; }));

  // 1e6 does not fit fp16 even after dividing by P: every element is reported non-finite.
  for (std::size_t i = 0; i < ex.layout().size(); ++i) {
    auto v = ex.view(i);
    std::fill(v.begin(), v.end(), 1e6f);
    ex.ready(i);
  }
  const auto st2 = ex.finish();
  CHECK_FALSE(st2.finite());
  CHECK(st2.nonfinite == ex.pool_size());
  CHECK(gflow_test::same_on_all_ranks(t, st2.nonfinite));
}
