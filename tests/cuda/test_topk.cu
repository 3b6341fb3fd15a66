// Device Top-k kernels (include/gflow/detail/cuda/topk.cuh) against the host references
// (include/gflow/detail/kernels/topk.hpp), which tests/test_topk.cpp checks against brute force.
// Everything is compared bit for bit: selections (indices and order), wire values, residuals,
// scatters, merges (kept list and records, counts).
#include <gflow/detail/cuda/topk.cuh>
#include <gflow/detail/kernels/topk.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;

using f16 = gflow::half;
using bf16 = gflow::bfloat16;
namespace k = gflow::detail::kernels;
namespace gc = gflow::detail::cuda;


template <class T>
struct dvec {
  T* p = nullptr;
  explicit dvec(std::size_t count) {
    void* q = nullptr;
    ok(cudaMalloc(&q, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
    p = static_cast<T*>(q);
  }
  explicit dvec(const std::vector<T>& h) : dvec(h.size()) {
    if (!h.empty()) ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~dvec() { (void)cudaFree(p); }
  dvec(const dvec&) = delete;
  dvec& operator=(const dvec&) = delete;
  std::vector<T> get(std::size_t count) const {
    std::vector<T> h(count);
    if (count) ok(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<float> make_values(std::mt19937_64& rng, std::size_t n, int mode) {
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (mode) {
      case 0: x = std::ldexp(static_cast<float>(rng() % 200001) - 100000.0f, -static_cast<int>(rng() % 30)); break;
      case 1: x = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;  // many ties
      case 2: x = (rng() % 2) ? -0.0f : 0.0f; break;
      default: x = std::bit_cast<float>(static_cast<std::uint32_t>(rng())); break;  // any bits, NaN and inf included
    }
  }
  return v;
}

template <class I>
void check_select(std::mt19937_64& rng, std::size_t n, std::size_t kk, int mode, gc::topk_selector& sel) {
  const auto v = make_values(rng, n, mode);
  const std::uint64_t base = rng() % 100000;
  std::vector<std::uint32_t> scratch(n);
  std::vector<I> want(std::min(kk, n));
  const std::size_t c = k::select_topk(v.data(), n, kk, base, want.data(), scratch.data());
  dvec<float> dv(v);
  dvec<I> dout(want.size());
  sel.select(dv.p, n, kk, base, dout.p, nullptr);
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after select");
  EXPECT_MSG(same_bytes(dout.get(c), want), "n " + std::to_string(n) + " k " + std::to_string(kk) + " mode " + std::to_string(mode));
}

}  // namespace

GFLOW_CUDA_TEST("kernels", topk_select_matches_host_radix_select) {
  std::mt19937_64 rng(1);
  gc::topk_selector sel(1 << 22);
  for (int trial = 0; trial < 120; ++trial) {
    const std::size_t n = trial < 60 ? 1 + rng() % 5000 : 1 + rng() % (1 << 22);
    const std::size_t kk = trial % 7 == 0 ? 1 : trial % 7 == 1 ? n : 1 + rng() % std::max<std::size_t>(1, n / (1 + rng() % 1000));
    if (trial % 2) check_select<std::uint32_t>(rng, n, kk, trial % 4, sel);
    else check_select<std::uint64_t>(rng, n, kk, trial % 4, sel);
  }
  EXPECT_THROWS_AS(sel.select(static_cast<const float*>(nullptr), (1 << 22) + 1, 1, 0, static_cast<std::uint32_t*>(nullptr), nullptr),
                   gflow::invalid_argument);
}

// The candidates path of topk_selector::select (units of 2^20 elements and more, k <= n / 64):
// the same indices as the host's radix select, and each path taken where it should be: spread and
// random-bit keys go through the candidates; many ties and zeros (12 key bits cannot separate
// them: too many candidates) and a sample that saw only the large elements (too few) fall back
// to the full selection.
GFLOW_CUDA_TEST("kernels", topk_select_candidates_path_and_fallbacks) {
  std::mt19937_64 rng(7);
  const std::size_t n = (std::size_t{3} << 20) + 7;
  gc::topk_selector sel(1 << 22);
  auto path_of = [&](auto&& fn) {
    const auto before = sel.paths();
    fn();
    const auto after = sel.paths();
    return after.candidates > before.candidates ? 'c' : after.full > before.full ? 'f' : '-';
  };
  for (int mode : {0, 3}) {
    for (std::size_t kk : {std::size_t{1}, std::size_t{3000}, std::size_t{30000}, n / 64}) {
      const char p = path_of([&] { check_select<std::uint32_t>(rng, n, kk, mode, sel); });
      EXPECT_MSG(p == 'c', "mode " + std::to_string(mode) + " k " + std::to_string(kk) + ": the candidates path ran (got '" + std::string(1, p) + "')");
    }
  }
  for (int mode : {1, 2}) {
    const char p = path_of([&] { check_select<std::uint64_t>(rng, n, 5000, mode, sel); });
    EXPECT_MSG(p == 'f', "mode " + std::to_string(mode) + ": the full selection ran (got '" + std::string(1, p) + "')");
  }
  EXPECT(path_of([&] { check_select<std::uint32_t>(rng, n, n / 64 + 1, 0, sel); }) == 'f');  // k above n / 64
  EXPECT(path_of([&] { check_select<std::uint32_t>(rng, (1 << 20) - 1, 100, 0, sel); }) == 'f');  // a unit under 2^20
  {  // the sample sees only large values: fewer candidates than k
    const std::size_t m = std::size_t{1} << 22, kk = m / 64;
    std::vector<float> v(m);
    for (std::size_t i = 0; i < m; ++i) v[i] = std::ldexp(static_cast<float>(rng() % 1000 + 1), -40);
    for (std::size_t j = 1; j < 65536; ++j) v[j * m / 65536] = 2.0f;  // every sampled position but the first
    std::vector<std::uint32_t> scratch(m), want(kk);
    k::select_topk(v.data(), m, kk, 0, want.data(), scratch.data());
    dvec<float> dv(v);
    dvec<std::uint32_t> dout(kk);
    const char p = path_of([&] {
      sel.select(dv.p, m, kk, 0, dout.p, nullptr);
      ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after select");
    });
    EXPECT_MSG(p == 'f', std::string("too few candidates: the full selection ran (got '") + p + "')");
    EXPECT(same_bytes(dout.get(kk), want));
  }
}

GFLOW_CUDA_TEST("kernels", topk_take_scatter_and_residual_match_host) {
  std::mt19937_64 rng(2);
  const std::size_t n = 100000;
  auto G = make_values(rng, n, 0);
  G[5] = std::nanf("");
  G[6] = std::numeric_limits<float>::infinity();
  G[7] = 70000.0f;
  std::vector<std::uint32_t> scratch(n), idx(2000);
  idx.resize(k::select_topk(G.data(), n, 2000, 0, idx.data(), scratch.data()));
  idx[0] = 5;  // make sure the non-finite ones are in
  idx[1] = 6;
  idx[2] = 7;
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  auto run = [&](auto tag, float scale, float unscale) {
    using W = decltype(tag);
    std::vector<float> res_h(n, 3.0f);
    std::vector<W> out_h(idx.size());
    k::take_selected(G.data(), res_h.data(), idx.data(), idx.size(), out_h.data(), scale, unscale);
    dvec<float> dG(G), dres(std::vector<float>(n, 3.0f));
    dvec<std::uint32_t> didx(idx);
    dvec<W> dout(idx.size());
    gc::take_selected(dG.p, dres.p, didx.p, idx.size(), dout.p, scale, unscale, nullptr);
    // scatter_add / decode_scatter of what was taken
    std::vector<float> acc_h(n, 1.0f), set_h(n, 0.0f), dec(idx.size());
    k::scatter_add(acc_h.data(), idx.data(), out_h.data(), idx.size());
    k::decode_scaled(out_h.data(), idx.size(), 0.25f, dec.data());
    k::scatter_set(set_h.data(), idx.data(), dec.data(), idx.size());
    dvec<float> dacc(std::vector<float>(n, 1.0f)), dset(std::vector<float>(n, 0.0f));
    dvec<unsigned long long> counter(std::vector<unsigned long long>{0});
    gc::scatter_add(dacc.p, didx.p, dout.p, idx.size(), nullptr);
    gc::decode_scatter(dset.p, didx.p, dout.p, idx.size(), 0.25f, counter.p, nullptr);
    ok(cudaDeviceSynchronize(), "sync");
    EXPECT(same_bytes(dout.get(idx.size()), out_h));
    EXPECT(same_bytes(dres.get(n), res_h));
    EXPECT(same_bytes(dacc.get(n), acc_h));
    EXPECT(same_bytes(dset.get(n), set_h));
    EXPECT(counter.get(1)[0] == static_cast<unsigned long long>(k::count_nonfinite(dec.data(), dec.size())));
  };
  run(float{}, 1.0f, 1.0f);
  run(f16{}, 0.125f, 8.0f);
  run(bf16{}, 1.0f / 3.0f, 3.0f);
  // accumulate_residual
  auto g = make_values(rng, n, 0), r = make_values(rng, n, 0);
  auto gh = g, rh = r;
  k::accumulate_residual(gh.data(), rh.data(), n);
  dvec<float> dg(g), dr(r);
  gc::accumulate_residual(dg.p, dr.p, n, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
  EXPECT(same_bytes(dg.get(n), gh));
  EXPECT(same_bytes(dr.get(n), rh));
}

namespace {
template <class I, class W>
void check_merge(std::mt19937_64& rng, gc::topk_merger<I, W>& m, std::size_t kmax) {
  const std::size_t kk = 1 + rng() % kmax;
  const std::size_t range = kk + rng() % (3 * kk + 1);
  auto make = [&](std::vector<I>& idx, std::vector<W>& val, bool ties) {
    std::vector<I> all(range);
    for (std::size_t i = 0; i < range; ++i) all[i] = static_cast<I>(1000 + i);
    std::shuffle(all.begin(), all.end(), rng);
    idx.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(rng() % (kk + 1)));
    std::sort(idx.begin(), idx.end());
    val.clear();
    for (std::size_t j = 0; j < idx.size(); ++j)
      val.push_back(k::wire_cast<W>(ties ? static_cast<float>(static_cast<int>(rng() % 5) - 2) : static_cast<float>(rng() % 20001) / 1e4f - 1.0f));
  };
  const bool ties = rng() % 3 == 0;
  std::vector<I> ai, bi;
  std::vector<W> av, bv;
  make(ai, av, ties);
  make(bi, bv, ties);
  // host
  std::vector<I> oi(kk), ri(2 * kk), ui(2 * kk);
  std::vector<W> ov(kk);
  std::vector<float> rv(2 * kk), us(2 * kk);
  std::vector<std::uint32_t> uk(2 * kk);
  std::size_t nrec = 0;
  const std::size_t kept = k::merge_topk(ai.data(), av.data(), ai.size(), bi.data(), bv.data(), bi.size(), kk, oi.data(), ov.data(), ri.data(), rv.data(),
                                         &nrec, k::merge_scratch<I>{ui.data(), us.data(), uk.data()});
  oi.resize(kept);
  ov.resize(kept);
  ri.resize(nrec);
  rv.resize(nrec);
  // device
  dvec<I> dai(ai), dbi(bi), doi(kk), dri(2 * kk);
  dvec<W> dav(av), dbv(bv), dov(kk);
  dvec<float> drv(2 * kk);
  dvec<unsigned> dcounts(2);
  m.merge(dai.p, dav.p, ai.size(), dbi.p, dbv.p, bi.size(), kk, doi.p, dov.p, dri.p, drv.p, dcounts.p, nullptr);
  ok(cudaDeviceSynchronize(), "sync after merge");
  const auto counts = dcounts.get(2);
  const std::string what = "k " + std::to_string(kk) + " na " + std::to_string(ai.size()) + " nb " + std::to_string(bi.size());
  EXPECT_MSG(counts[0] == kept && counts[1] == nrec, what);
  if (counts[0] == kept && counts[1] == nrec) {
    EXPECT_MSG(same_bytes(doi.get(kept), oi), what);
    EXPECT_MSG(same_bytes(dov.get(kept), ov), what);
    EXPECT_MSG(same_bytes(dri.get(nrec), ri), what);
    EXPECT_MSG(same_bytes(drv.get(nrec), rv), what);
  }
}
}  // namespace

GFLOW_CUDA_TEST("kernels", topk_merge_matches_host_definition_1) {
  std::mt19937_64 rng(3);
  const std::size_t kmax = 3000;
  gc::topk_merger<std::uint32_t, float> m32(kmax);
  gc::topk_merger<std::uint64_t, f16> m16(kmax);
  gc::topk_merger<std::uint32_t, bf16> mb(kmax);
  for (int trial = 0; trial < 60; ++trial) {
    check_merge(rng, m32, trial < 30 ? 20 : kmax);
    check_merge(rng, m16, trial < 30 ? 20 : kmax);
    check_merge(rng, mb, trial < 30 ? 20 : kmax);
  }
}
