// The device kernels the engines run on device memory (issue 12), against the host kernels, bit
// for bit: CSC's fused kernels with the shared norm order (cuda/sparse_chunks.cuh), and the Top-k
// engine kernels (cuda/topk_engine.cuh), including the message checker on every kind of corrupt
// message (its verdict must be the host's kernels::unpack_checked, field for field). Floats are
// compared bit for bit except NaN payloads (CUDA returns the canonical NaN; see same_floats).
#include <gflow/detail/cuda/sparse_chunks.cuh>
#include <gflow/detail/cuda/topk_engine.cuh>
#include <gflow/detail/kernels/sparse_chunks.hpp>
#include <gflow/detail/kernels/topk.hpp>

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

using gflow_cuda_test::dbuf;
using gflow_cuda_test::ok;
namespace gc = gflow::detail::cuda;
namespace hk = gflow::detail::kernels;

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Bitwise, except that any two NaNs match: CUDA's fp32 / fp64 arithmetic returns the canonical
// NaN where x86 keeps the operand's payload (a NaN input of a product or of a norm).
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) * std::ldexp(1.0f, -static_cast<int>(g() % 20));
  v[n / 3] = std::numeric_limits<float>::infinity();
  v[n / 2] = std::numeric_limits<float>::quiet_NaN();
  v[n / 5] = 70000.0f;  // overflows fp16
  return v;
}

template <class W>
void fused_chunks_case(std::size_t n, std::size_t C) {
  const std::size_t chunks = (n + C - 1) / C;
  std::vector<std::uint32_t> sel, rest;
  for (std::uint32_t c = 0; c < chunks; ++c) (c % 3 == 1 ? sel : rest).push_back(c);
  if (chunks > 0 && (chunks - 1) % 3 != 1) sel.push_back(static_cast<std::uint32_t>(chunks - 1)), rest.pop_back();  // the partial chunk selected
  std::sort(sel.begin(), sel.end());
  const auto pool0 = random_values(n, 1), hist0 = random_values(n, 2);
  std::vector<float> hist_h(hist0);
  for (auto& x : hist_h) x = std::isfinite(x) ? x : 0.0f;  // a history is finite
  // Host.
  std::vector<float> pool_h(pool0), hh(hist_h), norms_h(chunks, -1.0f);
  std::vector<W> wire_h(n);
  std::size_t bad_h = 0;
  const float s = 0.25f, u = 4.0f;
  const std::size_t m = hk::compact_chunks_to_wire(pool_h.data(), hh.data(), n, C, sel.data(), sel.size(), wire_h.data(), s, u);
  hk::defer_chunks(pool_h.data(), hh.data(), n, C, rest.data(), rest.size(), 0.9f, norms_h.data());
  bad_h += hk::scatter_chunks_from_wire(wire_h.data(), pool_h.data(), n, C, sel.data(), sel.size(), norms_h.data(), 0.5f);
  std::vector<float> buf_h(m), pool2_h(pool0);
  for (std::size_t i = 0; i < m; ++i) buf_h[i] = pool0[i % n];
  const std::size_t bad2_h = hk::scatter_chunks_counted(buf_h.data(), pool2_h.data(), n, C, sel.data(), sel.size(), true, 0.125f, norms_h.data(), 2.0f);
  // Device.
  dbuf<float> pool(pool0), hist(hist_h), norms(std::vector<float>(chunks, -1.0f)), buf(buf_h), pool2(pool0);
  dbuf<std::uint32_t> dsel(sel), drest(rest);
  dbuf<W> wire(n);
  dbuf<unsigned long long> counter(std::vector<unsigned long long>{0});
  gc::compact_chunks_to_wire(pool.p, hist.p, n, C, dsel.p, sel.size(), wire.p, s, u, nullptr);
  gc::defer_chunks_exact(pool.p, hist.p, n, C, drest.p, rest.size(), 0.9f, norms.p, nullptr);
  gc::scatter_chunks_from_wire(wire.p, pool.p, n, C, dsel.p, sel.size(), norms.p, 0.5f, counter.p, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
  const auto bad_d = counter.get()[0];
  counter.put({0});
  gc::scatter_chunks_counted(buf.p, pool2.p, n, C, dsel.p, sel.size(), true, 0.125f, norms.p, 2.0f, counter.p, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
  const std::string what = "n=" + std::to_string(n) + " C=" + std::to_string(C) + " W=" + std::to_string(sizeof(W));
  EXPECT_MSG(same_bytes(wire.get(), wire_h), what + ": compact_chunks_to_wire output");
  EXPECT_MSG(same_floats(hist.get(), hh), what + ": history after compaction and deferral");
  EXPECT_MSG(same_floats(pool.get(), pool_h), what + ": pool after deferral and scatter_chunks_from_wire");
  EXPECT_MSG(same_floats(pool2.get(), pool2_h), what + ": pool after scatter_chunks_counted");
  EXPECT_MSG(same_floats(norms.get(), norms_h), what + ": chunk norms (the shared order)");
  EXPECT_MSG(bad_d == bad_h, what + ": scatter_chunks_from_wire inf/NaN count");
  EXPECT_MSG(counter.get()[0] == bad2_h, what + ": scatter_chunks_counted inf/NaN count");
}

template <class I, class W>
void checker_case(const std::vector<unsigned char>& msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, const char* name) {
  std::vector<I> hi_idx(k + 1);
  std::vector<W> hi_val(k + 1);
  const gflow::detail::sparse_message::unpack_result want = hk::unpack_checked(msg.data(), k, lo, hi, hi_idx.data(), hi_val.data());
  dbuf<unsigned char> dmsg(msg);
  dbuf<I> didx(k + 1);
  dbuf<W> dval(k + 1);
  gc::message_checker checker;
  const gflow::detail::sparse_message::unpack_result got = checker.check(dmsg.p, k, lo, hi, didx.p, dval.p, nullptr);
  EXPECT_MSG(got.fault == want.fault && got.count == want.count && got.position == want.position && got.bad_index == want.bad_index &&
                 got.header.status == want.header.status && got.header.count == want.header.count,
             std::string("message checker, ") + name + ": verdict differs from kernels::unpack_checked");
  if (want.ok() && want.count) {
    auto gi = didx.get();
    auto gv = dval.get();
    EXPECT_MSG(std::memcmp(gi.data(), hi_idx.data(), want.count * sizeof(I)) == 0 && std::memcmp(gv.data(), hi_val.data(), want.count * sizeof(W)) == 0,
               std::string("message checker, ") + name + ": unpacked entries");
  }
}

template <class I, class W>
void checker_cases() {
  const std::size_t k = 7;
  const std::uint64_t lo = 100, hi = 1000;
  std::vector<I> idx = {101, 150, 151, 400, 999};
  std::vector<W> val(idx.size());
  for (std::size_t j = 0; j < val.size(); ++j) val[j] = hk::wire_cast<W>(static_cast<float>(j) - 2.5f);
  auto make = [&](const std::vector<I>& ix, const std::vector<W>& vx, std::size_t count, gflow::detail::sparse_message::header h = {}) {
    std::vector<unsigned char> m(gflow::detail::sparse_message::bytes(k, sizeof(I), sizeof(W)) + 3);  // +3: an odd offset below
    gflow::detail::sparse_message::pack(m.data() + 3, k, ix.data(), vx.data(), count, h);
    return std::vector<unsigned char>(m.begin() + 3, m.end());
  };
  checker_case<I, W>(make(idx, val, idx.size()), k, lo, hi, "valid");
  checker_case<I, W>(make(idx, val, 0), k, lo, hi, "empty");
  auto m = make(idx, val, idx.size());
  const std::uint64_t too_many = k + 1;
  std::memcpy(m.data(), &too_many, sizeof too_many);
  checker_case<I, W>(m, k, lo, hi, "count over k");
  auto bad = idx;
  bad[2] = 1000;
  checker_case<I, W>(make(bad, val, idx.size()), k, lo, hi, "index out of range");
  bad = idx;
  bad[3] = 150;
  checker_case<I, W>(make(bad, val, idx.size()), k, lo, hi, "index out of order");
  auto vb = val;
  vb[1] = hk::wire_cast<W>(std::numeric_limits<float>::quiet_NaN());
  checker_case<I, W>(make(idx, vb, idx.size()), k, lo, hi, "NaN value");
  bad = idx;
  bad[1] = 99;
  vb = val;
  vb[4] = hk::wire_cast<W>(std::numeric_limits<float>::quiet_NaN());
  checker_case<I, W>(make(bad, vb, idx.size()), k, lo, hi, "two faults: the first wins");
  checker_case<I, W>(make(idx, val, idx.size(), gflow::detail::sparse_message::header{0, 2, 1, 3, 0}), k, lo, hi, "status set upstream");
}

}  // namespace

GFLOW_CUDA_TEST("kernels", csc_fused_device_kernels_equal_host_bitwise) {
  for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{70001}})
    for (std::size_t C : {std::size_t{8}, std::size_t{1000}, std::size_t{32768}}) {
      fused_chunks_case<gflow::half>(n, C);
      fused_chunks_case<gflow::bfloat16>(n, C);
    }
}

GFLOW_CUDA_TEST("kernels", message_checker_equals_unpack_checked) {
  checker_cases<std::uint32_t, float>();
  checker_cases<std::uint32_t, gflow::half>();
  checker_cases<std::uint64_t, gflow::half>();
  checker_cases<std::uint64_t, gflow::bfloat16>();
}

GFLOW_CUDA_TEST("kernels", topk_engine_device_kernels_equal_host_bitwise) {
  const std::size_t n = 50000, k = 300;
  auto g = random_values(n, 5), r0 = random_values(n, 6);
  for (auto& x : r0) x = std::isfinite(x) ? x : 0.0f;
  // accumulate + select + take_selected_dropping
  std::vector<float> res_h(r0);
  std::vector<std::uint32_t> idx_h(k), scratch(n);
  hk::accumulate_into_residual(g.data(), res_h.data(), n);
  const std::size_t cnt = hk::select_topk(res_h.data(), n, k, 0, idx_h.data(), scratch.data());
  std::vector<gflow::half> val_h(k);
  const bool drop = cnt < n && hk::selection_all_nonfinite(res_h.data(), idx_h.data(), cnt);
  hk::take_selected(res_h.data(), res_h.data(), idx_h.data(), cnt, val_h.data(), 0.5f, 2.0f);
  if (drop) hk::clear_nonfinite(res_h.data(), n);
  dbuf<float> dg(g), dres(r0);
  dbuf<std::uint32_t> didx(k);
  dbuf<gflow::half> dval(k);
  dbuf<unsigned> flag(1);
  gc::accumulate_into_residual(dg.p, dres.p, n, nullptr);
  gc::topk_selector sel(n);
  sel.select(dres.p, n, k, 0, didx.p, nullptr);
  gc::take_selected_dropping(dres.p, 0, n, didx.p, cnt, dval.p, 0.5f, 2.0f, flag.p, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
  EXPECT_MSG(same_bytes(didx.get(), idx_h), "selection");
  EXPECT_MSG(same_bytes(dval.get(), val_h), "taken values");
  EXPECT_MSG(same_floats(dres.get(), res_h), "residual after the take");
  // restore_unselected against a final list holding every other selected index, restore_records_in
  std::vector<std::uint32_t> fin;
  for (std::size_t j = 0; j < cnt; j += 2) fin.push_back(idx_h[j]);
  std::vector<float> rv(cnt);
  for (std::size_t j = 0; j < cnt; ++j) rv[j] = static_cast<float>(j) * 0.001f;
  hk::restore_unselected(res_h.data(), idx_h.data(), val_h.data(), cnt, fin.data(), fin.size(), 2.0f);
  hk::restore_records_in(res_h.data(), idx_h.data(), rv.data(), cnt, fin.data(), fin.size(), 2.0f);
  dbuf<std::uint32_t> dfin(fin);
  dbuf<float> drv(rv);
  gc::restore_unselected(dres.p, didx.p, dval.p, cnt, dfin.p, fin.size(), 2.0f, nullptr);
  gc::restore_records_in(dres.p, didx.p, drv.p, cnt, dfin.p, fin.size(), 2.0f, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
  EXPECT_MSG(same_floats(dres.get(), res_h), "residual after restore_unselected / restore_records_in");
}
