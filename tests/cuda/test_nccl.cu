// gflow::nccl::transport and the Exchanger on device memory, over every visible GPU
// (init_all(ndev); one host thread per rank). With one GPU these are 1-rank exchanges: the
// average must equal the input exactly.
#include <gflow/cuda/exchanger.cuh>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/nccl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <type_traits>
#include <string>
#include <thread>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;
using gflow_cuda_test::dbuf;
using gflow_cuda_test::device_count;
using gflow_cuda_test::run_ranks;

using f16 = gflow::half;
using bf16 = gflow::bfloat16;
namespace gc = gflow::detail::cuda;
using gflow::nccl::transport;

}  // namespace

GFLOW_CUDA_TEST("nccl", collectives_on_every_visible_device) {
  auto ranks = transport::init_all(device_count());
  const int P = static_cast<int>(ranks.size());
  std::printf("  %d rank(s)\n", P);
  run_ranks(ranks, [P](transport& t) {
    const int r = t.rank();
    EXPECT(t.size() == P);
    const std::size_t n = 1000;

    // all_reduce (sum, blocking) and iall_reduce (max) + wait
    dbuf<float> a(n);
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(r + 1) + static_cast<float>(i);
    a.put(h);
    t.all_reduce(a.p, n, gflow::reduce_op::sum);
    auto got = a.get();
    bool good = true;
    for (std::size_t i = 0; i < n; ++i)
      good &= got[i] == static_cast<float>(P * (P + 1) / 2) + static_cast<float>(P) * static_cast<float>(i);
    EXPECT_MSG(good, "all_reduce sum on rank " + std::to_string(r));

    dbuf<std::int32_t> m(3);
    m.put({r, -r, 7});
    auto req = t.iall_reduce(m.p, 3, gflow::reduce_op::max);
    t.wait(req);
    t.wait(req);  // a completed request waits for nothing
    auto mx = m.get();
    EXPECT(mx[0] == P - 1 && mx[1] == 0 && mx[2] == 7);

    // all_gather
    dbuf<std::uint64_t> s(4), g(4 * static_cast<std::size_t>(P));
    s.put({std::uint64_t(r) * 100, std::uint64_t(r) * 100 + 1, std::uint64_t(r) * 100 + 2, std::uint64_t(r) * 100 + 3});
    t.all_gather(s.p, g.p, 4);
    auto gg = g.get();
    good = true;
    for (int q = 0; q < P; ++q)
      for (int j = 0; j < 4; ++j) good &= gg[static_cast<std::size_t>(q * 4 + j)] == std::uint64_t(q) * 100 + std::uint64_t(j);
    EXPECT_MSG(good, "all_gather on rank " + std::to_string(r));

    // broadcast from the last rank, reduce to rank 0
    dbuf<double> b(2);
    b.put({double(r), double(r) * 2});
    t.broadcast(b.p, 2, P - 1);
    auto bb = b.get();
    EXPECT(bb[0] == double(P - 1) && bb[1] == double(2 * (P - 1)));
    dbuf<std::int64_t> red(1);
    red.put({std::int64_t(r) + 1});
    t.reduce(red.p, 1, gflow::reduce_op::sum, 0);
    if (r == 0) EXPECT(red.get()[0] == std::int64_t(P) * (P + 1) / 2);

    // point to point: a ring shift, send and recv in one group
    dbuf<std::uint8_t> out(16), in(16);
    out.put(std::vector<std::uint8_t>(16, static_cast<std::uint8_t>(r + 1)));
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    transport::request rs, rr;
    {
      gflow::nccl::group grp;
      rs = t.isend(out.p, 16, next);
      rr = t.irecv(in.p, 16, prev);
      EXPECT_THROWS_AS(t.barrier(), gflow::usage_error);  // blocking calls are refused inside a group
      grp.end();
    }
    t.wait(rs);
    t.wait(rr);
    EXPECT(in.get() == std::vector<std::uint8_t>(16, static_cast<std::uint8_t>(prev + 1)));

    // fp16 / bf16 sums
    dbuf<f16> hh(2);
    hh.put({f16{0x3c00}, f16{0x3800}});  // 1, 0.5
    t.all_reduce(hh.p, 2, gflow::reduce_op::sum);
    auto hs = hh.get();
    EXPECT(gflow::detail::kernels::to_float(hs[0]) == float(P) && gflow::detail::kernels::to_float(hs[1]) == 0.5f * float(P));
    dbuf<bf16> bh(1);
    bh.put({bf16{0x3f80}});
    t.all_reduce(bh.p, 1, gflow::reduce_op::sum);
    EXPECT(gflow::detail::kernels::to_float(bh.get()[0]) == float(P));

    // a stream waits for a request without blocking the host
    cudaStream_t other = nullptr;
    ok(cudaStreamCreate(&other), "cudaStreamCreate");
    auto req2 = t.iall_reduce(a.p, n, gflow::reduce_op::sum);
    t.enqueue_wait(req2, other);
    ok(cudaStreamSynchronize(other), "cudaStreamSynchronize");
    t.wait(req2);
    ok(cudaStreamDestroy(other), "cudaStreamDestroy");

    t.barrier();

    // argument errors are reported before NCCL sees them
    EXPECT_THROWS_AS(t.broadcast(b.p, 2, P), gflow::invalid_argument);
    EXPECT_THROWS_AS(t.send(out.p, 16, -1), gflow::invalid_argument);
    EXPECT_THROWS_AS(t.split(-1, 0), gflow::invalid_argument);
  });
}

// What Sparsifier<OkTopK<d>> calls on device buffers: all_reduce of u64 sums, all_to_all of u64,
// all_gather of u8, and the variable collectives (gflow::variable_transport: one group of
// ncclSend / ncclRecv per peer, empty blocks skipped), with blocks of different sizes, some empty.
namespace {
template <class T>
T vvalue(int src, int dst, std::size_t j) {
  return static_cast<T>(static_cast<std::uint64_t>(src) * 1000003ull + static_cast<std::uint64_t>(dst) * 1009ull + j * 7ull + 1ull);
}
std::size_t vcount(int src, int dst) { return static_cast<std::size_t>((src * 3 + dst * 5) % 4 == 0 ? 0 : 1 + (src * 7 + dst * 11) % 13); }
template <class T>
void put_if(dbuf<T>& d, const std::vector<T>& h) {
  if (!h.empty()) d.put(h);
}
template <class T>
void variable_collectives(transport& t) {
  const int P = t.size(), me = t.rank();
  const auto Pz = static_cast<std::size_t>(P);
  const std::string what = "rank " + std::to_string(me) + " of " + std::to_string(P) + ", " + std::to_string(sizeof(T)) + "-byte elements";
  {  // all_to_all
    const std::size_t n = 37;
    std::vector<T> send(n * Pz);
    for (int q = 0; q < P; ++q)
      for (std::size_t j = 0; j < n; ++j) send[static_cast<std::size_t>(q) * n + j] = vvalue<T>(me, q, j);
    dbuf<T> ds(send), dr(std::vector<T>(send.size(), T(0xab)));
    t.all_to_all(ds.p, dr.p, n);
    const auto got = dr.get();
    bool good = true;
    for (int q = 0; q < P; ++q)
      for (std::size_t j = 0; j < n; ++j) good &= got[static_cast<std::size_t>(q) * n + j] == vvalue<T>(q, me, j);
    EXPECT_MSG(good, what + ": all_to_all");
  }
  {  // all_to_allv
    std::vector<std::size_t> sc(Pz), rc(Pz);
    std::vector<T> send, want;
    for (int q = 0; q < P; ++q) {
      sc[static_cast<std::size_t>(q)] = vcount(me, q);
      rc[static_cast<std::size_t>(q)] = vcount(q, me);
      for (std::size_t j = 0; j < vcount(me, q); ++j) send.push_back(vvalue<T>(me, q, j));
      for (std::size_t j = 0; j < vcount(q, me); ++j) want.push_back(vvalue<T>(q, me, j));
    }
    dbuf<T> ds(send.size()), dr(std::vector<T>(want.size() + 4, T(0xab)));
    put_if(ds, send);
    t.all_to_allv(ds.p, sc.data(), dr.p, rc.data());
    const auto got = dr.get();
    EXPECT_MSG(std::equal(want.begin(), want.end(), got.begin()), what + ": all_to_allv");
    EXPECT_MSG(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(want.size()), got.end(), [](T x) { return x == T(0xab); }),
               what + ": all_to_allv wrote past its blocks");
  }
  {  // all_gatherv: rank 0 contributes nothing
    auto cnt = [](int q) { return q == 0 ? std::size_t{0} : vcount(q, q) + static_cast<std::size_t>(q); };
    std::vector<std::size_t> counts(Pz);
    std::vector<T> send, want;
    for (int q = 0; q < P; ++q) {
      counts[static_cast<std::size_t>(q)] = cnt(q);
      for (std::size_t j = 0; j < cnt(q); ++j) want.push_back(vvalue<T>(q, 0, j));
    }
    for (std::size_t j = 0; j < cnt(me); ++j) send.push_back(vvalue<T>(me, 0, j));
    dbuf<T> ds(send.size()), dr(std::vector<T>(want.size() + 4, T(0xab)));
    put_if(ds, send);
    t.all_gatherv(ds.p, send.size(), dr.p, counts.data());
    const auto got = dr.get();
    EXPECT_MSG(std::equal(want.begin(), want.end(), got.begin()), what + ": all_gatherv");
    EXPECT_MSG(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(want.size()), got.end(), [](T x) { return x == T(0xab); }),
               what + ": all_gatherv wrote past its blocks");
  }
}
}  // namespace

// Sharding<ReduceScatter>'s collectives (gflow::sharding_transport): a bucket of n elements split P
// ways, n / P each and one more for the first n mod P ranks (one ncclReduce / ncclBroadcast per
// block), and n a multiple of P (ncclReduceScatter / ncclAllGather). Small integers: exact sums.
namespace {
void shard_collectives(transport& t, std::size_t n) {
  const int P = t.size(), me = t.rank();
  const auto Pz = static_cast<std::size_t>(P);
  std::vector<std::size_t> counts(Pz), at(Pz, 0);
  for (std::size_t q = 0; q < Pz; ++q) counts[q] = n / Pz + (q < n % Pz ? 1 : 0);
  for (std::size_t q = 1; q < Pz; ++q) at[q] = at[q - 1] + counts[q - 1];
  const auto value = [](int rank, std::size_t j) { return static_cast<float>((static_cast<std::size_t>(rank) * 31 + j * 7) % 97); };
  std::vector<float> send(n);
  for (std::size_t j = 0; j < n; ++j) send[j] = value(me, j);
  const std::size_t mine = counts[static_cast<std::size_t>(me)];
  dbuf<float> ds(send), dr(std::vector<float>(mine + 3, -1.0f));
  t.reduce_scatter(ds.p, dr.p, counts.data(), gflow::reduce_op::sum);
  const auto got = dr.get();
  bool good = true;
  for (std::size_t j = 0; j < mine; ++j) {
    float sum = 0;
    for (int q = 0; q < P; ++q) sum += value(q, at[static_cast<std::size_t>(me)] + j);
    good &= got[j] == sum;
  }
  const std::string what = "rank " + std::to_string(me) + " of " + std::to_string(P) + ", n = " + std::to_string(n);
  EXPECT_MSG(good, what + ": reduce_scatter");
  EXPECT_MSG(got[mine] == -1.0f && got[mine + 2] == -1.0f, what + ": reduce_scatter wrote past this rank's block");
  // all_gatherv_in_place: each rank's block holds its own values; the rest is overwritten.
  std::vector<float> buf(n, -2.0f);
  for (std::size_t j = 0; j < mine; ++j) buf[at[static_cast<std::size_t>(me)] + j] = value(me, 1000 + j);
  dbuf<float> db(buf);
  t.all_gatherv_in_place(db.p, counts.data());
  const auto all = db.get();
  good = true;
  for (std::size_t q = 0; q < Pz; ++q)
    for (std::size_t j = 0; j < counts[q]; ++j) good &= all[at[q] + j] == value(static_cast<int>(q), 1000 + j);
  EXPECT_MSG(good, what + ": all_gatherv_in_place");
}
}  // namespace

GFLOW_CUDA_TEST("nccl", shard_collectives_on_every_visible_device) {
  static_assert(gflow::sharding_transport<transport>);
  auto ranks = transport::init_all(device_count());
  run_ranks(ranks, [](transport& t) {
    shard_collectives(t, 1000 * static_cast<std::size_t>(t.size()));      // equal blocks
    shard_collectives(t, 1000 * static_cast<std::size_t>(t.size()) + 1);  // uneven (one more on rank 0)
    shard_collectives(t, static_cast<std::size_t>(t.size()) / 2);         // empty blocks (P >= 2)
  });
}

GFLOW_CUDA_TEST("nccl", oktopk_collectives_on_every_visible_device) {
  static_assert(gflow::variable_transport<transport>);
  auto ranks = transport::init_all(device_count());
  run_ranks(ranks, [](transport& t) {
    const int P = t.size(), r = t.rank();
    // all_reduce of u64 sums (beyond 2^53: an integer sum, not a float one)
    dbuf<std::uint64_t> a(std::vector<std::uint64_t>{(std::uint64_t{1} << 60) + static_cast<std::uint64_t>(r), 3});
    t.all_reduce(a.p, 2, gflow::reduce_op::sum);
    const auto as = a.get();
    EXPECT(as[0] == (std::uint64_t{1} << 60) * static_cast<std::uint64_t>(P) + static_cast<std::uint64_t>(P * (P - 1) / 2));
    EXPECT(as[1] == 3u * static_cast<std::uint64_t>(P));
    // all_gather of u8
    dbuf<std::uint8_t> s(std::vector<std::uint8_t>{static_cast<std::uint8_t>(r + 1), static_cast<std::uint8_t>(200 - r), 7});
    dbuf<std::uint8_t> g(3 * static_cast<std::size_t>(P));
    t.all_gather(s.p, g.p, 3);
    const auto gg = g.get();
    bool good = true;
    for (int q = 0; q < P; ++q) {
      const auto u = static_cast<std::size_t>(q) * 3;
      good &= gg[u] == q + 1 && gg[u + 1] == 200 - q && gg[u + 2] == 7;
    }
    EXPECT_MSG(good, "all_gather u8 on rank " + std::to_string(r));
    variable_collectives<std::uint64_t>(t);
    variable_collectives<std::uint8_t>(t);
    variable_collectives<float>(t);
  });
}

GFLOW_CUDA_TEST("nccl", more_operations_than_the_event_ring) {
  auto ranks = transport::init_all(device_count());
  run_ranks(ranks, [](transport& t) {
    dbuf<float> a(1);
    a.put({1.0f});
    std::vector<transport::request> reqs;
    for (std::size_t i = 0; i < transport::event_ring_size + 10; ++i) reqs.push_back(t.iall_reduce(a.p, 1, gflow::reduce_op::max));
    for (auto& q : reqs) t.wait(q);
    EXPECT(a.get()[0] == 1.0f);
  });
}

GFLOW_CUDA_TEST("nccl", split_by_parity_reverses_order_by_key) {
  auto ranks = transport::init_all(device_count());
  const int P = static_cast<int>(ranks.size());
  run_ranks(ranks, [P](transport& t) {
    const int r = t.rank();
    transport sub = t.split(r % 2, -r);  // same color: even / odd ranks; key -r: reverse order
    int members = 0, before = 0;
    for (int q = r % 2; q < P; q += 2) {
      ++members;
      if (q > r) ++before;
    }
    EXPECT(sub.size() == members);
    EXPECT(sub.rank() == before);
    EXPECT(sub.stream() == t.stream());
    dbuf<std::int32_t> one(1);
    one.put({1});
    sub.all_reduce(one.p, 1, gflow::reduce_op::sum);
    EXPECT(one.get()[0] == members);
  });
}

namespace {

gflow::Layout test_layout() { return gflow::Layout::from_sizes({1000, 3, 70000, 17, 4096, 5}); }

/// Rank r's gradient of tensor i, element j: multiples of 1/8, exact in fp16 and bf16.
float grad(int r, std::size_t i, std::size_t j) {
  return static_cast<float>(static_cast<int>((j * 7 + i * 3) % 13) - 6) * 0.125f * static_cast<float>(r + 1);
}

template <class Wire>
void exchange_on_every_device(const char* label) {
  using Ex = typename gflow::Exchanger<gflow::Precision<Wire>, gflow::Fusion<(64 << 10)>>::template on<transport>;
  auto ranks = transport::init_all(device_count());
  const int P = static_cast<int>(ranks.size());
  const gflow::Layout layout = test_layout();
  std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
  std::vector<std::size_t> nonfinite(static_cast<std::size_t>(P));

  run_ranks(ranks, [&](transport& t) {
    const int r = t.rank();
    Ex ex(t, layout);
    for (int iter = 0; iter < 2; ++iter) {
      // Backward order: last tensor first. Tensor 1 goes through the copying path.
      dbuf<float> staging(layout[1].numel);
      for (std::size_t k = layout.size(); k-- > 0;) {
        std::vector<float> h(layout[k].numel);
        for (std::size_t j = 0; j < h.size(); ++j) h[j] = grad(r, k, j);
        if (iter == 1 && r == 0 && k == 2) h[5] = INFINITY;  // second iteration: rank 0 overflows
        if (k == 1) {
          staging.put(h);
          ex.ready(k, std::span<const float>(staging.p, staging.n));
        } else {
          auto v = ex.view(k);
          ok(cudaMemcpyAsync(v.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, t.stream()), "H2D");
          ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize after the H2D copy");
          ex.ready(k);
        }
      }
      const gflow::exchange_status st = ex.finish();
      EXPECT(st.collectives == ex.buckets().size());
      if (iter == 0) {
        EXPECT_MSG(st.finite(), std::string(label) + ": rank " + std::to_string(r) + " nonfinite " + std::to_string(st.nonfinite));
        std::vector<float> pool(ex.pool_size());
        ok(cudaMemcpy(pool.data(), ex.pool_data(), pool.size() * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
        // Compare with the exact average, tensor by tensor.
        double worst = 0;
        for (std::size_t k = 0; k < layout.size(); ++k) {
          auto v = ex.view(k);
          const std::size_t off = static_cast<std::size_t>(v.data() - ex.pool_data());
          for (std::size_t j = 0; j < v.size(); ++j) {
            double sum = 0;
            for (int q = 0; q < P; ++q) sum += grad(q, k, j);
            worst = std::max(worst, std::fabs(pool[off + j] - sum / P));
            if (P == 1 && pool[off + j] != grad(0, k, j)) worst = std::max(worst, 1.0);  // 1 rank: exact
          }
        }
        // Exact when P is a power of two; otherwise the 16-bit wire rounds the 1/P shares.
        // (NCCL also rounds each partial sum to the wire type.)
        const double tol = (std::is_same_v<Wire, float> ? 1e-6 : std::is_same_v<Wire, gflow::half> ? 1e-2 : 5e-2) * P;
        EXPECT_MSG(worst <= tol, std::string(label) + ": rank " + std::to_string(r) + " max error " + std::to_string(worst));
        results[static_cast<std::size_t>(r)] = std::move(pool);
      } else {
        nonfinite[static_cast<std::size_t>(r)] = st.nonfinite;
      }
    }
  });
  for (int q = 1; q < P; ++q)
    EXPECT_MSG(results[static_cast<std::size_t>(q)] == results[0], std::string(label) + ": rank " + std::to_string(q) + " differs from rank 0");
  for (int q = 0; q < P; ++q) EXPECT_MSG(nonfinite[static_cast<std::size_t>(q)] >= 1, std::string(label) + ": inf not reported on rank " + std::to_string(q));
  for (int q = 1; q < P; ++q) EXPECT(nonfinite[static_cast<std::size_t>(q)] == nonfinite[0]);
}

}  // namespace

GFLOW_CUDA_TEST("nccl", exchanger_fp32_wire) { exchange_on_every_device<float>("fp32"); }
GFLOW_CUDA_TEST("nccl", exchanger_fp16_wire) { exchange_on_every_device<gflow::half>("fp16"); }
GFLOW_CUDA_TEST("nccl", exchanger_bf16_wire) { exchange_on_every_device<gflow::bfloat16>("bf16"); }

namespace {

/// Rank r's gradient at pool index i in iteration it: a spread of magnitudes (clear winners and
/// near-ties for the selections), the same function on the host and the NCCL run.
float spread(int r, int it, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(r) * 1000003u + static_cast<std::uint64_t>(it) * 7919u + i) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  const float u = static_cast<float>(x & 0xffffff) / 16777216.0f - 0.5f;
  return u * std::ldexp(1.0f, -static_cast<int>((x >> 24) % 12));
}

/// Sparsifier<OkTopK> over NCCL (device memory: the threshold selection's kernels, the staged
/// all_to_all / all_to_allv / all_gather / all_gatherv) against the same exchanger over the host
/// in-process transport with as many ranks: pools and residuals identical bytes, every iteration
/// (short periods: exact and threshold selections, boundary estimates, global re-estimations).
template <class Policies>
void oktopk_nccl_equals_host(const char* label) {
  using dev_ex = typename Policies::template on<transport>;
  using host_ex = typename Policies::template on<gflow::inproc::transport>;
  constexpr int iterations = 7;
  const gflow::Layout layout = gflow::Layout::from_sizes({1000, 3, 70000, 17, 4096, 5, 30000});
  gflow::detail::oktopk_params prm;
  prm.threshold_period = 3;
  prm.boundary_period = 2;
  auto ranks = transport::init_all(device_count());
  const int P = static_cast<int>(ranks.size());
  using trace = std::vector<std::vector<float>>;  // per iteration: the pool, then the residual
  std::vector<trace> dev(static_cast<std::size_t>(P)), host(static_cast<std::size_t>(P));
  std::vector<std::size_t> thr_dev(static_cast<std::size_t>(P)), thr_host(static_cast<std::size_t>(P));
  run_ranks(ranks, [&](transport& t) {
    dev_ex ex(t, layout);
    ex.sparsifier().set_params(prm);
    const std::size_t n = ex.pool_size();
    auto& out = dev[static_cast<std::size_t>(t.rank())];
    for (int it = 0; it < iterations; ++it) {
      std::vector<float> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = spread(t.rank(), it, i);
      ok(cudaMemcpyAsync(ex.pool_data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice, t.stream()), "H2D");
      ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize after the H2D copy");
      for (std::size_t b = 0; b < layout.size(); ++b) ex.ready(b);
      (void)ex.finish();
      thr_dev[static_cast<std::size_t>(t.rank())] += ex.sparsifier().selections() - ex.sparsifier().reestimated().local;
      ok(cudaMemcpy(h.data(), ex.pool_data(), n * sizeof(float), cudaMemcpyDeviceToHost), "D2H of the pool");
      out.push_back(h);
      const auto r = ex.sparsifier().residual();
      ok(cudaMemcpy(h.data(), r.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "D2H of the residual");
      out.push_back(h);
    }
  });
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) {
    host_ex ex(t, layout);
    ex.sparsifier().set_params(prm);
    const std::size_t n = ex.pool_size();
    auto& out = host[static_cast<std::size_t>(t.rank())];
    for (int it = 0; it < iterations; ++it) {
      for (std::size_t i = 0; i < n; ++i) ex.pool_data()[i] = spread(t.rank(), it, i);
      for (std::size_t b = 0; b < layout.size(); ++b) ex.ready(b);
      (void)ex.finish();
      thr_host[static_cast<std::size_t>(t.rank())] += ex.sparsifier().selections() - ex.sparsifier().reestimated().local;
      out.emplace_back(ex.pool_data(), ex.pool_data() + n);
      const auto r = ex.sparsifier().residual();
      out.emplace_back(r.begin(), r.end());
    }
  });
  for (int q = 0; q < P; ++q) {
    const auto& d = dev[static_cast<std::size_t>(q)];
    const auto& h = host[static_cast<std::size_t>(q)];
    EXPECT_MSG(d.size() == h.size(), std::string(label) + ": iteration counts");
    for (std::size_t j = 0; j < d.size() && j < h.size(); ++j)
      EXPECT_MSG(d[j].size() == h[j].size() && std::memcmp(d[j].data(), h[j].data(), d[j].size() * sizeof(float)) == 0,
                 std::string(label) + ": rank " + std::to_string(q) + " iteration " + std::to_string(j / 2) + ": the " +
                     (j % 2 ? "residual" : "pool") + " differs from the host run's");
    EXPECT_MSG(thr_dev[static_cast<std::size_t>(q)] > 0 && thr_dev[static_cast<std::size_t>(q)] == thr_host[static_cast<std::size_t>(q)],
               std::string(label) + ": threshold selections ran (device " + std::to_string(thr_dev[static_cast<std::size_t>(q)]) + ", host " +
                   std::to_string(thr_host[static_cast<std::size_t>(q)]) + ")");
  }
  std::printf("  %s: %d rank(s), %d iterations compared\n", label, P, iterations);
}

}  // namespace

GFLOW_CUDA_TEST("nccl", oktopk_exchanger_equals_host) {
  oktopk_nccl_equals_host<gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.01>>>>("OkTopK fp32");
  oktopk_nccl_equals_host<gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.01>>, gflow::Precision<gflow::half>>>("OkTopK fp16");
  oktopk_nccl_equals_host<gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.005>>, gflow::Fusion<(64 << 10)>, gflow::Precision<gflow::bfloat16>>>(
      "OkTopK fused bf16");
}
