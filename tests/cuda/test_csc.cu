// CSC's device kernels (include/gflow/detail/cuda/sparse_chunks.cuh, include/gflow/detail/cuda/momentum_sgd.cuh)
// against the host references (include/gflow/detail/kernels/sparse_chunks.hpp,
// include/gflow/optim/momentum_sgd.hpp): element-wise results, the L1 norms (one summation order
// for both, kernels/sparse_chunks.hpp) and the selection, bit for bit.
#include <gflow/detail/cuda/momentum_sgd.cuh>
#include <gflow/detail/cuda/sparse_chunks.cuh>
#include <gflow/detail/kernels/sparse_chunks.hpp>
#include <gflow/optim/momentum_sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;
using gflow_cuda_test::dbuf;

namespace gc = gflow::detail::cuda;
namespace hk = gflow::detail::kernels;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_floats(std::mt19937& rng, std::size_t n) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> u(-4, 4);
  for (auto& x : v) x = u(rng);
  return v;
}

// A random ascending chunk list; the partial last chunk is included half of the time.
std::vector<std::uint32_t> random_list(std::mt19937& rng, std::size_t chunks) {
  std::vector<std::uint32_t> l;
  for (std::size_t c = 0; c < chunks; ++c)
    if (rng() % 3 == 0 || (c + 1 == chunks && rng() % 2)) l.push_back(static_cast<std::uint32_t>(c));
  return l;
}

}  // namespace

GFLOW_CUDA_TEST("kernels", csc_chunk_kernels_match_host) {
  std::mt19937 rng(17);
  const std::size_t shapes[][2] = {{1000, 32}, {1000, 1000}, {999, 64}, {5, 32768}, {300000, 32768}, {4097, 256}, {77, 1}};
  for (const auto& sh : shapes) {
    const std::size_t n = sh[0], C = sh[1], chunks = (n + C - 1) / C;
    for (int rep = 0; rep < 3; ++rep) {
      const std::string where = "n " + std::to_string(n) + ", C " + std::to_string(C);
      const auto pool = random_floats(rng, n), hist = random_floats(rng, n);
      const auto list = random_list(rng, chunks);
      const std::size_t cnt = list.size();
      dbuf<std::uint32_t> dlist(std::max<std::size_t>(cnt, 1));
      if (cnt) dlist.put(list);
      // chunk_l1_norms
      {
        std::vector<float> hn(chunks, -1.0f);
        hk::chunk_l1_norms(pool.data(), n, C, list.data(), cnt, hn.data(), 0.25f);
        dbuf<float> dp(pool), dn(std::vector<float>(chunks, -1.0f));
        gc::chunk_l1_norms(dp.p, n, C, dlist.p, cnt, dn.p, 0.25f, nullptr);
        EXPECT_MSG(same_bits(dn.get(), hn), where);
      }
      // compact_chunks with and without history, then scatter_chunks with norms
      {
        std::vector<float> hh = hist, hout(n, 0.0f);
        const std::size_t got = hk::compact_chunks(pool.data(), hh.data(), n, C, list.data(), cnt, hout.data());
        dbuf<float> dp(pool), dh(hist), dout(std::vector<float>(n, 0.0f));
        gc::compact_chunks(dp.p, dh.p, n, C, dlist.p, cnt, dout.p, nullptr);
        EXPECT_MSG(same_bits(dout.get(), hout), where);
        EXPECT_MSG(same_bits(dh.get(), hh), where);
        std::vector<float> hout2(n, 0.0f);
        hk::compact_chunks(pool.data(), nullptr, n, C, list.data(), cnt, hout2.data());
        dbuf<float> dout2(std::vector<float>(n, 0.0f));
        gc::compact_chunks(dp.p, nullptr, n, C, dlist.p, cnt, dout2.p, nullptr);
        EXPECT_MSG(same_bits(dout2.get(), hout2), where);

        auto buf = random_floats(rng, got);
        std::vector<float> hp(n, 9.0f), hn(chunks, -1.0f);
        hk::scatter_chunks(buf.data(), hp.data(), n, C, list.data(), cnt, hn.data(), 0.5f);
        dbuf<float> db(std::max<std::size_t>(got, 1)), dp2(std::vector<float>(n, 9.0f)), dn(std::vector<float>(chunks, -1.0f));
        if (got) db.put(buf);
        gc::scatter_chunks(db.p, dp2.p, n, C, dlist.p, cnt, dn.p, 0.5f, nullptr);
        EXPECT_MSG(same_bits(dp2.get(), hp), where);
        EXPECT_MSG(same_bits(dn.get(), hn), where);
      }
      // defer_chunks
      for (float m : {0.0f, 0.9f, 1.0f}) {
        std::vector<float> hp = pool, hh = hist, hn(chunks, -1.0f);
        hk::defer_chunks(hp.data(), hh.data(), n, C, list.data(), cnt, m, hn.data());
        dbuf<float> dp(pool), dh(hist), dn(std::vector<float>(chunks, -1.0f));
        gc::defer_chunks(dp.p, dh.p, n, C, dlist.p, cnt, m, dn.p, nullptr);
        EXPECT_MSG(same_bits(dp.get(), hp), where);
        EXPECT_MSG(same_bits(dh.get(), hh), where);
        EXPECT_MSG(same_bits(dn.get(), hn), where);
      }
    }
  }
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

GFLOW_CUDA_TEST("kernels", csc_chunk_selection_matches_host_with_ties_inf_and_nan) {
  std::mt19937 rng(23);
  gc::chunk_selector sel(5000);
  const float inf = std::numeric_limits<float>::infinity();
  for (int rep = 0; rep < 300; ++rep) {
    const std::size_t chunks = 1 + rng() % 5000, k = rng() % (chunks + 1);
    std::vector<float> norms(chunks);
    for (auto& x : norms) {
      const unsigned r = rng() % 100;
      x = r < 2 ? std::nanf("") : r < 4 ? inf : r < 10 ? 0.0f : float(rng() % 50) * 0.125f;  // many ties
    }
    std::vector<std::uint32_t> want(chunks);
    hk::select_top_chunks(norms.data(), chunks, k, want.data());
    dbuf<float> dn(norms);
    dbuf<std::uint32_t> dout(chunks);
    sel.select(dn.p, chunks, k, dout.p, nullptr);
    EXPECT_MSG(dout.get() == want, "chunks " + std::to_string(chunks) + ", k " + std::to_string(k));
  }
  dbuf<float> dn(std::vector<float>(10, 1.0f));
  dbuf<std::uint32_t> dout(10);
  EXPECT_THROWS_AS(sel.select(dn.p, 6000, 3, dout.p, nullptr), gflow::invalid_argument);
  EXPECT_THROWS_AS(gc::chunk_selector(0), gflow::invalid_argument);
}

GFLOW_CUDA_TEST("kernels", csc_momentum_sgd_step_matches_host_bit_for_bit) {
  std::mt19937 rng(29);
  for (const std::size_t C : {std::size_t{1}, std::size_t{8}, std::size_t{1000}, std::size_t{32768}}) {
    const std::size_t n = 70001, chunks = (n + C - 1) / C;
    const auto w0 = random_floats(rng, n), g = random_floats(rng, n), hu0 = random_floats(rng, n);
    const auto list = random_list(rng, chunks);
    dbuf<std::uint32_t> dlist(std::max<std::size_t>(list.size(), 1));
    if (!list.empty()) dlist.put(list);
    // Whole pool, then a sub-range (a tensor at offset 12345 of 20000 elements).
    for (const auto& [off, len] : {std::pair<std::size_t, std::size_t>{0, n}, {12345, 20000}}) {
      std::vector<float> w = w0, hu = hu0;
      gflow::optim::kernels::momentum_sgd_step(w.data() + off, g.data() + off, hu.data() + off, off, len, C, list.data(), list.size(), 0.05f,
                                               0.9f);
      dbuf<float> dw(w0), dg(g), dhu(hu0);
      gc::momentum_sgd_step(dw.p + off, dg.p + off, dhu.p + off, off, len, C, dlist.p, list.size(), 0.05f, 0.9f, nullptr);
      const std::string where = "C " + std::to_string(C) + ", offset " + std::to_string(off);
      EXPECT_MSG(same_bits(dw.get(), w), where);
      EXPECT_MSG(same_bits(dhu.get(), hu), where);
    }
    std::vector<float> w = w0, hu = hu0;
    gflow::optim::kernels::momentum_sgd_step_all(w.data(), g.data(), hu.data(), n, 0.05f, 0.9f);
    dbuf<float> dw(w0), dg(g), dhu(hu0);
    gc::momentum_sgd_step_all(dw.p, dg.p, dhu.p, n, 0.05f, 0.9f, nullptr);
    EXPECT(same_bits(dw.get(), w));
    EXPECT(same_bits(dhu.get(), hu));
  }
}
