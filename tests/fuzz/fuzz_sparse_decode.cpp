// libFuzzer target: the receiving side of a Top-k sparse message (kernels/topk.hpp).
// A message is decoded with unpack_checked and, when accepted, scattered into a gradient
// buffer with scatter_add, as Sparsifier<TopK> / <GTopK> do with every message they receive.
//
// Input: [variant u8][lo u16][span-1 u16][message bytes ...]
//   variant bit 0: indices u32 / u64; (variant >> 1) % 3: values fp32 / fp16 / bf16
//   the selection range is [lo, lo + span); the buffer scattered into holds exactly lo + span floats
//   the message's capacity k is what its length holds: (bytes - 24) / (sizeof(I) + sizeof(W))
// Invariants (abort on violation): a rejected message writes nothing and names a fault; an
// accepted one has count <= k, indices strictly increasing inside [lo, hi), no NaN value, and
// scatter_add writes exactly those entries (ASan catches any access outside the buffers).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_util.hpp"
#include "gflow/detail/kernels/topk.hpp"

namespace {

namespace k = gflow::detail::kernels;

template <class I, class W>
void run(const std::uint8_t* data, std::size_t size, std::uint64_t lo, std::uint64_t hi) {
  if (size < gflow::detail::sparse_message::header_bytes) return;
  const std::size_t cap = (size - gflow::detail::sparse_message::header_bytes) / (sizeof(I) + sizeof(W));
  const std::size_t bytes = gflow::detail::sparse_message::bytes(cap, sizeof(I), sizeof(W));
  // Exactly-sized heap copies, so any read or write past an end is an ASan report.
  std::unique_ptr<unsigned char[]> msg(new unsigned char[bytes]);
  std::memcpy(msg.get(), data, bytes);
  std::unique_ptr<I[]> idx(new I[cap + 1]);  // +1: never zero-length; the extra slot is a canary
  std::unique_ptr<W[]> val(new W[cap + 1]);
  std::memset(idx.get(), 0xA5, (cap + 1) * sizeof(I));
  std::memset(val.get(), 0xA5, (cap + 1) * sizeof(W));

  const gflow::detail::sparse_message::unpack_result r = k::unpack_checked<I, W>(msg.get(), cap, lo, hi, idx.get(), val.get());
  const std::string text = gflow::detail::sparse_message::describe(r, cap, lo, hi);  // the error text must build for any fault
  FUZZ_CHECK(!text.empty());
  FUZZ_CHECK(std::memcmp(&r.header, msg.get(), sizeof r.header) == 0);
  if (!r.ok()) {
    FUZZ_CHECK(r.count == 0);
    for (std::size_t j = 0; j <= cap; ++j) {  // nothing was copied out of a rejected message
      unsigned char b[sizeof(I) > sizeof(W) ? sizeof(I) : sizeof(W)];
      std::memcpy(b, &idx[j], sizeof(I));
      for (std::size_t q = 0; q < sizeof(I); ++q) FUZZ_CHECK(b[q] == 0xA5);
      std::memcpy(b, &val[j], sizeof(W));
      for (std::size_t q = 0; q < sizeof(W); ++q) FUZZ_CHECK(b[q] == 0xA5);
    }
    return;
  }
  FUZZ_CHECK(r.header.status == 0);
  FUZZ_CHECK(r.count == r.header.count && r.count <= cap);
  for (std::size_t j = 0; j < r.count; ++j) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[j]);
    FUZZ_CHECK(i >= lo && i < hi);
    FUZZ_CHECK(j == 0 || i > static_cast<std::uint64_t>(idx[j - 1]));
    FUZZ_CHECK(!std::isnan(k::to_float(val[j])));
  }
  std::vector<float> dst(static_cast<std::size_t>(hi), 0.0f);
  k::scatter_add(dst.data(), idx.get(), val.get(), r.count);
  // Each accepted entry landed once at its index; everything else is untouched.
  std::size_t touched = 0;
  for (std::size_t j = 0; j < r.count; ++j) {
    const float want = 0.0f + k::to_float(val[j]);
    FUZZ_CHECK(std::memcmp(&dst[static_cast<std::size_t>(idx[j])], &want, sizeof want) == 0);
  }
  for (float x : dst) touched += x != 0.0f || std::signbit(x);
  std::size_t nonzero = 0;
  for (std::size_t j = 0; j < r.count; ++j) nonzero += k::to_float(val[j]) != 0.0f;
  FUZZ_CHECK(touched == nonzero);
}

template <class I>
void by_value(int w, const std::uint8_t* data, std::size_t size, std::uint64_t lo, std::uint64_t hi) {
  if (w == 0) run<I, float>(data, size, lo, hi);
  else if (w == 1) run<I, gflow::half>(data, size, lo, hi);
  else run<I, gflow::bfloat16>(data, size, lo, hi);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::reader in{data, size};
  const auto variant = in.take<std::uint8_t>();
  const std::uint64_t lo = in.take<std::uint16_t>();
  const std::uint64_t hi = lo + std::uint64_t{in.take<std::uint16_t>()} + 1;
  const int w = (variant >> 1) % 3;
  if (variant & 1) by_value<std::uint64_t>(w, in.p, in.n, lo, hi);
  else by_value<std::uint32_t>(w, in.p, in.n, lo, hi);
  return 0;
}
