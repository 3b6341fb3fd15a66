// libFuzzer target: gTop-k's merge path (kernels/topk.hpp) on two received messages:
// unpack_checked both, merge_topk them (Definition 1 of gTop-k (Shi et al.)), then restore_unselected and
// restore_records_in into a residual, as Sparsifier<GTopK> does in every tree round.
//
// Input: [variant u8][mode u8][lo u16][span-1 u16][k-1 u8][two messages ...]
//   variant as in fuzz_sparse_decode (bit 0: u32/u64 indices; (variant >> 1) % 3: fp32/fp16/bf16)
//   mode 0 (raw): the two messages are the next 2 * message_bytes(k) bytes (zeros past the end)
//   mode 1 (built): each list is [count u8][count x (gap u16, value W)]: indices lo + gap, then
//     previous + 1 + gap; packed with gflow::detail::sparse_message::pack, so most inputs reach the merge (indices past
//     hi or NaN values are still rejected by unpack_checked)
// Invariants (abort on violation): kept <= k and = min(k, |union|); kept and record indices
// strictly increasing inside [lo, hi) and from the union; kept value = W(sum); every union entry
// is either kept (its rounding error recorded when non-zero) or recorded with its whole sum;
// restore_* touch only the lists' indices. Buffers are exactly sized (ASan catches overruns).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_util.hpp"
#include "gflow/detail/kernels/topk.hpp"

namespace {

namespace k = gflow::detail::kernels;

template <class I, class W>
std::unique_ptr<unsigned char[]> build(fuzz::reader& in, std::size_t cap, std::uint64_t lo, bool raw) {
  const std::size_t bytes = gflow::detail::sparse_message::bytes(cap, sizeof(I), sizeof(W));
  std::unique_ptr<unsigned char[]> msg(new unsigned char[bytes]());
  if (raw) {
    for (std::size_t b = 0; b < bytes; ++b) msg[b] = in.take<std::uint8_t>();
    return msg;
  }
  const std::size_t count = in.take<std::uint8_t>() % (cap + 1);
  std::vector<I> idx(count);
  std::vector<W> val(count);
  std::uint64_t at = lo;
  for (std::size_t j = 0; j < count; ++j) {
    at += (j ? 1 : 0) + in.take<std::uint16_t>();
    idx[j] = static_cast<I>(at);
    val[j] = in.take<W>();
  }
  gflow::detail::sparse_message::pack(msg.get(), cap, idx.data(), val.data(), count);
  return msg;
}

template <class I, class W>
void run(fuzz::reader in, bool raw, std::uint64_t lo, std::uint64_t hi, std::size_t cap) {
  const auto ma = build<I, W>(in, cap, lo, raw);
  const auto mb = build<I, W>(in, cap, lo, raw);
  std::unique_ptr<I[]> ai(new I[cap]), bi(new I[cap]), oi(new I[cap]), ri(new I[2 * cap]), si(new I[2 * cap]);
  std::unique_ptr<W[]> av(new W[cap]), bv(new W[cap]), ov(new W[cap]);
  std::unique_ptr<float[]> rv(new float[2 * cap]), ssum(new float[2 * cap]);
  std::unique_ptr<std::uint32_t[]> skey(new std::uint32_t[2 * cap]);
  const auto ra = k::unpack_checked<I, W>(ma.get(), cap, lo, hi, ai.get(), av.get());
  const auto rb = k::unpack_checked<I, W>(mb.get(), cap, lo, hi, bi.get(), bv.get());
  if (!ra.ok() || !rb.ok()) return;

  // The reference: union of the two lists with fp32 sums, NaN (inf + -inf) as +inf.
  std::map<std::uint64_t, float> uni;
  for (std::size_t j = 0; j < ra.count; ++j) uni[ai[j]] = k::to_float(av[j]);
  for (std::size_t j = 0; j < rb.count; ++j) {
    auto [it, fresh] = uni.emplace(bi[j], k::to_float(bv[j]));
    if (!fresh) it->second = k::sanitize(it->second + k::to_float(bv[j]));
  }

  std::size_t nrec = ~std::size_t{0};
  const std::size_t kept = k::merge_topk<I, W>(ai.get(), av.get(), ra.count, bi.get(), bv.get(), rb.count, cap, oi.get(), ov.get(), ri.get(),
                                                rv.get(), &nrec, k::merge_scratch<I>{si.get(), ssum.get(), skey.get()});
  FUZZ_CHECK(kept <= cap);
  FUZZ_CHECK(kept == (uni.size() < cap ? uni.size() : cap));
  FUZZ_CHECK(nrec <= 2 * cap);
  std::map<std::uint64_t, float> rec;
  for (std::size_t j = 0; j < nrec; ++j) {
    FUZZ_CHECK(ri[j] >= lo && ri[j] < hi);
    FUZZ_CHECK(j == 0 || ri[j] > ri[j - 1]);
    FUZZ_CHECK(uni.count(ri[j]) == 1);
    rec[ri[j]] = rv[j];
  }
  std::uint32_t min_kept_key = 0xffffffffu;
  for (std::size_t j = 0; j < kept; ++j) {
    FUZZ_CHECK(oi[j] >= lo && oi[j] < hi);
    FUZZ_CHECK(j == 0 || oi[j] > oi[j - 1]);
    const auto u = uni.find(oi[j]);
    FUZZ_CHECK(u != uni.end());
    FUZZ_CHECK(ov[j] == k::wire_cast<W>(u->second));
    const float w = k::to_float(ov[j]);
    const auto r = rec.find(oi[j]);
    if (r != rec.end()) FUZZ_CHECK(w + r->second == u->second);     // rounding error recorded exactly
    else FUZZ_CHECK(w == u->second || k::nonfinite_bit(w));         // or there was none (or it overflowed)
    const std::uint32_t key = k::magnitude_key(u->second);
    if (key < min_kept_key) min_kept_key = key;
    rec.erase(oi[j]);
  }
  // What is left in rec are the dropped entries: each whole sum, none larger than a kept one.
  FUZZ_CHECK(kept + rec.size() == uni.size());
  for (const auto& [i, v] : rec) {
    FUZZ_CHECK(std::memcmp(&v, &uni[i], sizeof v) == 0);
    FUZZ_CHECK(k::magnitude_key(v) <= min_kept_key);
  }

  // Restores into a residual of exactly hi floats; only list indices may change.
  std::vector<float> residual(static_cast<std::size_t>(hi), 0.0f);
  k::restore_unselected(residual.data(), ai.get(), av.get(), ra.count, oi.get(), kept, 1.0f);
  k::restore_records_in(residual.data(), ri.get(), rv.get(), nrec, oi.get(), kept, 1.0f);
  for (std::size_t i = 0; i < residual.size(); ++i)
    if (residual[i] != 0.0f) FUZZ_CHECK(uni.count(i) == 1);
  // This rank's own entries that the merge dropped come back whole (Algorithm 4, line 10).
  for (std::size_t j = 0, p = 0; j < ra.count; ++j) {
    while (p < kept && oi[p] < ai[j]) ++p;
    if (p < kept && oi[p] == ai[j]) continue;
    const float v = k::to_float(av[j]);
    FUZZ_CHECK(residual[static_cast<std::size_t>(ai[j])] == (k::nonfinite_bit(v) ? 0.0f : v));
  }
}

template <class I>
void by_value(int w, const fuzz::reader& in, bool raw, std::uint64_t lo, std::uint64_t hi, std::size_t cap) {
  if (w == 0) run<I, float>(in, raw, lo, hi, cap);
  else if (w == 1) run<I, gflow::half>(in, raw, lo, hi, cap);
  else run<I, gflow::bfloat16>(in, raw, lo, hi, cap);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::reader in{data, size};
  const auto variant = in.take<std::uint8_t>();
  const bool raw = (in.take<std::uint8_t>() & 1) == 0;
  const std::uint64_t lo = in.take<std::uint16_t>();
  const std::uint64_t hi = lo + std::uint64_t{in.take<std::uint16_t>()} + 1;
  const std::size_t cap = std::size_t{in.take<std::uint8_t>()} + 1;
  const int w = (variant >> 1) % 3;
  if (variant & 1) by_value<std::uint64_t>(w, in, raw, lo, hi, cap);
  else by_value<std::uint32_t>(w, in, raw, lo, hi, cap);
  return 0;
}
