// OkTopK's device kernels (cuda/oktopk.cuh, through device_backend's context as the engine calls
// them) against the host kernels (host_backend: kernels::accumulate_gather_above, gather_keys,
// scatter_add), bit for bit: the count, the residual after, every entry of the positions and
// keys including the poison past the count; and the variable collectives of
// gflow::inproc_device::transport (all_to_all, all_to_allv, all_gatherv) on P = 1..4 ranks.
// NaN: the device kernels give the host's (x86) NaN bits, so single-NaN sums and inf - inf are
// compared bit for bit; NaN + NaN (where the host's own payload depends on its compiler) is kept
// out of the data.
#include <gflow/detail/cuda/device_backend.cuh>
#include <gflow/cuda/inproc_transport.cuh>
#include <gflow/detail/cuda/oktopk.cuh>
#include <gflow/detail/engines/host_backend.hpp>
#include <gflow/detail/kernels/topk.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;
namespace gc = gflow::detail::cuda;
namespace hk = gflow::detail::kernels;
using gflow::detail::device_backend;
using gflow::detail::host_backend;

/// An owning device array holding a host vector (empty ones too).
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(const std::vector<T>& h) : n(h.size()) {
    void* q = nullptr;
    ok(cudaMalloc(&q, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    p = static_cast<T*>(q);
    if (n) ok(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // a pageable cudaMemcpy may return before the copy lands, and the kernels run on a
    // non-blocking stream that does not wait for the legacy stream: wait for the device
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after an H2D copy");
  }
  ~dbuf() { (void)cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
std::size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size() == b.size() ? static_cast<std::size_t>(-1) : std::min(a.size(), b.size());
}

/// What device_backend's context is built over: a stream (and the current device).
struct stream_owner {
  cudaStream_t s = nullptr;
  stream_owner() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~stream_owner() { (void)cudaStreamDestroy(s); }
  stream_owner(const stream_owner&) = delete;
  stream_owner& operator=(const stream_owner&) = delete;
  [[nodiscard]] cudaStream_t stream() const noexcept { return s; }
};

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
bool is_nan(float x) { return hk::magnitude_key(x) > 0x7f800000u; }

/// n values of one kind; mode 3 and 4 hold inf / NaN (any payload, signalling ones too).
std::vector<float> make_values(std::mt19937_64& rng, std::size_t n, int mode) {
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (mode) {
      case 0: x = std::ldexp(static_cast<float>(static_cast<int>(rng() % 200001) - 100000), -static_cast<int>(rng() % 40)); break;
      case 1: x = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;  // many ties, zeros
      case 2: x = rng() % 50 == 0 ? static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f : ((rng() % 2) ? -0.0f : 0.0f); break;
      case 3: {
        const unsigned r = static_cast<unsigned>(rng() % 64);
        if (r == 0) x = std::numeric_limits<float>::infinity();
        else if (r == 1) x = -std::numeric_limits<float>::infinity();
        else if (r == 2) x = from_bits(0x7f800000u | static_cast<std::uint32_t>(1 + rng() % 0x7fffff));  // NaN, any payload, sNaN too
        else if (r == 3) x = from_bits(0xff800000u | static_cast<std::uint32_t>(1 + rng() % 0x7fffff));
        else if (r == 4) x = from_bits(static_cast<std::uint32_t>(rng() % 0x800000));  // subnormal
        else x = std::ldexp(static_cast<float>(static_cast<int>(rng() % 2001) - 1000), -static_cast<int>(rng() % 12));
        break;
      }
      default: x = from_bits(static_cast<std::uint32_t>(rng())); break;  // any bits
    }
  }
  return v;
}

/// Where both operands of a sum would be NaN, the second is made finite (see the header comment).
void no_double_nan(const std::vector<float>& a, std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (is_nan(a[i]) && is_nan(b[i])) b[i] = 1.5f;
}

struct gather_case {
  std::size_t n;
  std::uint32_t t;
  std::size_t cap;
  std::uint64_t base;
  std::string what;
};

// One call on each backend from the same inputs, outputs poisoned alike; everything compared.
void check_gather(device_backend::context& dk, const std::vector<float>& g, const std::vector<float>& r, const gather_case& c) {
  const std::size_t n = c.n, slots = c.cap + 3;
  int dummy = 0;
  host_backend::context hk_(dummy);
  std::vector<float> res_h = r;
  std::vector<std::uint64_t> pos_h(slots, 0xdeadbeefcafef00dull);
  std::vector<std::uint32_t> keys_h(slots, 0xa5a5a5a5u);
  const std::size_t got_h = hk_.accumulate_gather_above(g.data(), res_h.data(), n, c.t, c.base, pos_h.data(), keys_h.data(), c.cap);

  dbuf<float> dg(g), dres(r);
  dbuf<std::uint64_t> dpos(std::vector<std::uint64_t>(slots, 0xdeadbeefcafef00dull));
  dbuf<std::uint32_t> dkeys(std::vector<std::uint32_t>(slots, 0xa5a5a5a5u));
  const std::size_t got_d = dk.accumulate_gather_above(dg.p, dres.p, n, c.t, c.base, dpos.p, dkeys.p, c.cap);
  ok(cudaStreamSynchronize(dk.stream()), "cudaStreamSynchronize after accumulate_gather_above");

  // The host twin against the definition, so that a wrong host kernel cannot hide a wrong device one.
  std::size_t want = 0;
  for (std::size_t i = 0; i < n; ++i) want += hk::magnitude_key(res_h[i]) >= c.t;
  const std::string what = c.what + " n " + std::to_string(n) + " t " + std::to_string(c.t) + " cap " + std::to_string(c.cap) + " (above: " +
                           std::to_string(want) + ")";
  EXPECT_MSG(got_h == (want > c.cap ? c.cap + 1 : want), what + ": host count " + std::to_string(got_h));
  EXPECT_MSG(got_d == got_h, what + ": device count " + std::to_string(got_d) + ", host " + std::to_string(got_h));
  const auto res_d = dres.get();
  const auto pos_dv = dpos.get();
  const auto keys_d = dkeys.get();
  EXPECT_MSG(same_bytes(res_d, res_h), what + ": residual differs at " + std::to_string(first_difference(res_d, res_h)));
  EXPECT_MSG(same_bytes(pos_dv, pos_h), what + ": positions differ at " + std::to_string(first_difference(pos_dv, pos_h)));
  EXPECT_MSG(same_bytes(keys_d, keys_h), what + ": keys differ at " + std::to_string(first_difference(keys_d, keys_h)));
}

// The thresholds and capacities of one unit: t at a key of the data (ties at the threshold), at
// 1 (every non-zero), at inf's key (inf and NaN), above every finite key (NaN only), above every
// key (none); for each, the capacities that put the count below, at, one above and far above it.
void gather_cases(device_backend::context& dk, std::mt19937_64& rng, std::size_t n, int mode) {
  auto g = make_values(rng, n, mode), r = make_values(rng, n, mode == 4 ? 3 : mode);
  no_double_nan(g, r);
  std::vector<float> G = r;
  hk::accumulate_into_residual(g.data(), G.data(), n);
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = hk::magnitude_key(G[i]);
  std::vector<std::uint32_t> ts = {1u, 0x7f800000u, 0x7f800001u, 0x7fffffffu, 0x80000000u};
  if (n) {
    std::vector<std::uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (double q : {0.001, 0.05, 0.5}) {  // the key at that quantile, where it is not 0
      const std::uint32_t k = sorted[std::min(n - 1, static_cast<std::size_t>(q * static_cast<double>(n)))];
      if (k) ts.push_back(k);
    }
  }
  const std::uint64_t base = rng() % 2 ? rng() % (std::uint64_t{1} << 40) : 0;
  for (std::uint32_t t : ts) {
    std::size_t above = 0;
    for (std::uint32_t k : keys) above += k >= t;
    std::vector<std::size_t> caps = {above + 5, above, above / 4, 0};
    if (above) caps.push_back(above - 1);
    for (std::size_t cap : caps) check_gather(dk, g, r, {n, t, cap, base, "mode " + std::to_string(mode)});
  }
}

}  // namespace

GFLOW_CUDA_TEST("kernels", oktopk_accumulate_gather_above_matches_host) {
  stream_owner so;
  device_backend::context dk(so);
  std::mt19937_64 rng(24);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{2047}, std::size_t{2048}, std::size_t{2049}, std::size_t{4097},
                        std::size_t{100003}})
    for (int mode = 0; mode < 5; ++mode) gather_cases(dk, rng, n, mode);
  for (int mode : {0, 1, 3}) gather_cases(dk, rng, (std::size_t{1} << 20) + 3, mode);  // many tiles; its scratch grows once
  gather_cases(dk, rng, 4097, 3);                                                     // and serves a smaller unit again
  // many elements tied at the threshold key across tiles, the capacity cutting through them
  {
    const std::size_t n = 50000;
    std::vector<float> g(n, 0.0f), r(n);
    for (std::size_t i = 0; i < n; ++i) r[i] = (i % 3 == 0) ? 2.0f : (i % 3 == 1 ? -2.0f : 1.0f);
    const std::uint32_t t = hk::magnitude_key(2.0f);
    for (std::size_t cap : {std::size_t{0}, std::size_t{1}, std::size_t{2047}, std::size_t{2048}, std::size_t{2049}, n / 3, 2 * n / 3 - 1,
                            2 * n / 3, 2 * n / 3 + 1, n})
      check_gather(dk, g, r, {n, t, cap, 7, "ties"});
  }
  // the unit limit of one call: 2^32 - 1 elements
  EXPECT_THROWS_AS(gc::threshold_gatherer(std::size_t{1} << 32), gflow::invalid_argument);
  gc::threshold_gatherer small(16);
  EXPECT_THROWS_AS(small.gather(nullptr, nullptr, 17, 1, 0, nullptr, nullptr, 1, so.stream()), gflow::invalid_argument);
}

namespace {
template <class I>
void check_gather_keys_and_add_at(device_backend::context& dk, std::mt19937_64& rng, std::size_t n, std::size_t count, int mode) {
  int dummy = 0;
  host_backend::context hk_(dummy);
  const std::string what = std::string(sizeof(I) == 4 ? "u32" : "u64") + " n " + std::to_string(n) + " count " + std::to_string(count) +
                           " mode " + std::to_string(mode);
  // gather_keys: any indices (repeats allowed)
  {
    const auto v = make_values(rng, n, mode);
    std::vector<I> idx(count);
    for (auto& i : idx) i = static_cast<I>(rng() % n);
    std::vector<std::uint32_t> kh(count + 2, 0x5a5a5a5au);
    hk_.gather_keys(v.data(), idx.data(), count, kh.data());
    bool definition = true;
    for (std::size_t j = 0; j < count; ++j) definition &= kh[j] == (std::bit_cast<std::uint32_t>(v[static_cast<std::size_t>(idx[j])]) & 0x7fffffffu);
    EXPECT_MSG(definition, what + ": host gather_keys");
    dbuf<float> dv(v);
    dbuf<I> didx(idx);
    dbuf<std::uint32_t> dkeys(std::vector<std::uint32_t>(count + 2, 0x5a5a5a5au));
    dk.gather_keys(dv.p, didx.p, count, dkeys.p);
    ok(cudaStreamSynchronize(dk.stream()), "cudaStreamSynchronize after gather_keys");
    const auto kd = dkeys.get();
    EXPECT_MSG(same_bytes(kd, kh), what + ": gather_keys differs at " + std::to_string(first_difference(kd, kh)));
  }
  // add_at: distinct indices in any order
  {
    auto dst = make_values(rng, n, mode);
    auto v = make_values(rng, count, mode == 4 ? 3 : mode);
    std::vector<I> all(n);
    std::iota(all.begin(), all.end(), I{0});
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<I> idx(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count));
    for (std::size_t j = 0; j < count; ++j)
      if (is_nan(dst[static_cast<std::size_t>(idx[j])]) && is_nan(v[j])) v[j] = -0.75f;
    std::vector<float> want = dst;
    hk_.add_at(want.data(), idx.data(), v.data(), count);
    bool definition = true;  // the host twin against the definition (NaN bits aside)
    for (std::size_t j = 0; j < count; ++j) {
      const std::size_t i = static_cast<std::size_t>(idx[j]);
      const float s = dst[i] + v[j];
      definition &= std::bit_cast<std::uint32_t>(s) == std::bit_cast<std::uint32_t>(want[i]) || (std::isnan(s) && std::isnan(want[i]));
    }
    EXPECT_MSG(definition, what + ": host add_at");
    dbuf<float> ddst(dst), dv(v);
    dbuf<I> didx(idx);
    dk.add_at(ddst.p, didx.p, dv.p, count);
    ok(cudaStreamSynchronize(dk.stream()), "cudaStreamSynchronize after add_at");
    const auto got = ddst.get();
    EXPECT_MSG(same_bytes(got, want), what + ": add_at differs at " + std::to_string(first_difference(got, want)));
  }
}
}  // namespace

GFLOW_CUDA_TEST("kernels", oktopk_gather_keys_and_add_at_match_host) {
  stream_owner so;
  device_backend::context dk(so);
  std::mt19937_64 rng(25);
  for (int mode = 0; mode < 5; ++mode) {
    const std::vector<std::pair<std::size_t, std::size_t>> sizes = {{1, 0}, {1, 1}, {7, 7}, {5000, 1000}, {300007, 100003}};
    for (auto [n, count] : sizes) {
      check_gather_keys_and_add_at<std::uint32_t>(dk, rng, n, count, mode);
      check_gather_keys_and_add_at<std::uint64_t>(dk, rng, n, count, mode);
    }
  }
  // round to nearest, ties to even, subnormals kept: exact expectations
  {
    const std::vector<float> dst = {1.0f, 1.0f, from_bits(1u), 3.0f, std::numeric_limits<float>::infinity(), from_bits(0x7f800001u)};
    const std::vector<float> v = {std::ldexp(1.0f, -24), std::ldexp(3.0f, -25), from_bits(1u), 0.0f, -std::numeric_limits<float>::infinity(), 1.0f};
    const std::vector<std::uint32_t> idx = {0, 1, 2, 3, 4, 5};
    dbuf<float> ddst(dst), dv(v);
    dbuf<std::uint32_t> didx(idx);
    dk.add_at(ddst.p, didx.p, dv.p, idx.size());
    ok(cudaStreamSynchronize(dk.stream()), "sync");
    const auto got = ddst.get();
    EXPECT(std::bit_cast<std::uint32_t>(got[0]) == 0x3f800000u);                    // 1 + 2^-24: the tie goes to even
    EXPECT(std::bit_cast<std::uint32_t>(got[1]) == 0x3f800001u);                    // 1 + 1.5 * 2^-24: up
    EXPECT(std::bit_cast<std::uint32_t>(got[2]) == 2u);                             // subnormals are not flushed
    EXPECT(std::bit_cast<std::uint32_t>(got[3]) == 0x40400000u);                    // untouched value
    EXPECT(is_nan(got[4]));                                                         // inf - inf: the host's default NaN
#if defined(__x86_64__)
    EXPECT(std::bit_cast<std::uint32_t>(got[4]) == 0xffc00000u);
#endif
    EXPECT(std::bit_cast<std::uint32_t>(got[5]) == 0x7fc00001u);                    // the operand's NaN, quieted
  }
}

// ---- the variable collectives of the in-process device transport --------------------------------

namespace {
template <class T>
std::vector<T> to_host(const T* d, std::size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  if (n) ok(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync D2H");
  ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return h;
}
template <class T>
void to_device(T* d, const std::vector<T>& h, cudaStream_t s) {
  if (!h.empty()) ok(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D");
  ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}
// The value rank `src` sends as element j of its block for rank `dst`.
template <class T>
T value(int src, int dst, std::size_t j) {
  return static_cast<T>(static_cast<std::uint64_t>(src) * 1000003ull + static_cast<std::uint64_t>(dst) * 1009ull + j * 7ull + 1ull);
}
// Elements rank src sends to rank dst in the all_to_allv (some blocks empty).
std::size_t vcount(int src, int dst) { return static_cast<std::size_t>((src * 3 + dst * 5) % 4 == 0 ? 0 : 1 + (src * 7 + dst * 11) % 13); }

template <class T>
void variable_collectives(int P) {
  gflow::inproc_device::run(P, [&](gflow::inproc_device::transport& t) {
    const int me = t.rank();
    const cudaStream_t s = t.stream();
    const std::string what = "P " + std::to_string(P) + " rank " + std::to_string(me) + " " + std::to_string(sizeof(T)) + "-byte elements";
    const auto Pz = static_cast<std::size_t>(P);
    // all_to_all: n elements to each rank
    {
      const std::size_t n = 37;
      std::vector<T> send(n * Pz);
      for (int q = 0; q < P; ++q)
        for (std::size_t j = 0; j < n; ++j) send[static_cast<std::size_t>(q) * n + j] = value<T>(me, q, j);
      gc::device_array<T> ds(send.size(), "send"), dr(send.size(), "recv");
      to_device(ds.get(), send, s);
      to_device(dr.get(), std::vector<T>(send.size(), T(0xab)), s);
      t.all_to_all(ds.get(), dr.get(), n);
      const auto got = to_host(dr.get(), send.size(), s);
      bool good = true;
      for (int q = 0; q < P; ++q)
        for (std::size_t j = 0; j < n; ++j) good &= got[static_cast<std::size_t>(q) * n + j] == value<T>(q, me, j);
      EXPECT_MSG(good, what + ": all_to_all");
    }
    // all_to_allv: packed blocks of different sizes, some empty
    {
      std::vector<std::size_t> sc(Pz), rc(Pz);
      std::vector<T> send, want;
      for (int q = 0; q < P; ++q) {
        sc[static_cast<std::size_t>(q)] = vcount(me, q);
        rc[static_cast<std::size_t>(q)] = vcount(q, me);
        for (std::size_t j = 0; j < vcount(me, q); ++j) send.push_back(value<T>(me, q, j));
        for (std::size_t j = 0; j < vcount(q, me); ++j) want.push_back(value<T>(q, me, j));
      }
      gc::device_array<T> ds(send.size(), "send"), dr(want.size() + 4, "recv");
      to_device(ds.get(), send, s);
      to_device(dr.get(), std::vector<T>(want.size() + 4, T(0xab)), s);
      t.all_to_allv(ds.get(), sc.data(), dr.get(), rc.data());
      auto got = to_host(dr.get(), want.size() + 4, s);
      EXPECT_MSG(std::equal(want.begin(), want.end(), got.begin()), what + ": all_to_allv");
      EXPECT_MSG(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(want.size()), got.end(), [](T x) { return x == T(0xab); }),
                 what + ": all_to_allv wrote past its blocks");
    }
    // all_gatherv: rank q contributes vcount(q, q) + q elements (rank 0 maybe none)
    {
      auto cnt = [](int q) { return q == 0 ? std::size_t{0} : vcount(q, q) + static_cast<std::size_t>(q); };
      std::vector<std::size_t> counts(Pz);
      std::vector<T> send, want;
      for (int q = 0; q < P; ++q) {
        counts[static_cast<std::size_t>(q)] = cnt(q);
        for (std::size_t j = 0; j < cnt(q); ++j) want.push_back(value<T>(q, 0, j));
      }
      for (std::size_t j = 0; j < cnt(me); ++j) send.push_back(value<T>(me, 0, j));
      gc::device_array<T> ds(send.size(), "send"), dr(want.size() + 4, "recv");
      to_device(ds.get(), send, s);
      to_device(dr.get(), std::vector<T>(want.size() + 4, T(0xab)), s);
      t.all_gatherv(ds.get(), send.size(), dr.get(), counts.data());
      auto got = to_host(dr.get(), want.size() + 4, s);
      EXPECT_MSG(std::equal(want.begin(), want.end(), got.begin()), what + ": all_gatherv");
      EXPECT_MSG(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(want.size()), got.end(), [](T x) { return x == T(0xab); }),
                 what + ": all_gatherv wrote past its blocks");
    }
    // counts that disagree: the host transport's mismatch_error on every rank
    if (P > 1) {
      std::vector<std::size_t> sc(Pz, 1), rc(Pz, 1);
      if (me == 0) rc[1] = 2;  // rank 1 sends rank 0 one element; rank 0 expects two
      gc::device_array<T> ds(Pz, "send"), dr(Pz + 1, "recv");
      to_device(ds.get(), std::vector<T>(Pz, T(1)), s);
      EXPECT_THROWS_AS(t.all_to_allv(ds.get(), sc.data(), dr.get(), rc.data()), gflow::mismatch_error);
    }
  });
}
}  // namespace

GFLOW_CUDA_TEST("device", inproc_device_variable_collectives) {
  for (int P = 1; P <= 4; ++P) {
    variable_collectives<std::uint8_t>(P);
    variable_collectives<std::uint64_t>(P);
    variable_collectives<float>(P);
  }
}
