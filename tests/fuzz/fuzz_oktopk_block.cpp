// libFuzzer target: the receiving side of an OkTopK block (support/oktopk_message.hpp), as
// Sparsifier<OkTopK> checks every count and block it receives in its split-and-reduce and its
// allgatherv: a count announced ahead of the block (check_count against the sender's capacity),
// then the block of exactly that many entries (check_block: size, header count, indices strictly
// increasing inside the region, no NaN).
//
// Input: [variant u8][lo u16][span-1 u16][announced u16][cap u16][block bytes ...]
//   variant bit 0: indices u32 / u64; (variant >> 1) % 3: values fp32 / fp16 / bf16
//   the block is the rest of the input, whatever its length (a block whose size disagrees with
//   the announced count must be rejected)
// Invariants (abort on violation): a rejected count or block writes nothing and names a fault, and
// its error text builds; an accepted one has count == announced <= cap, the exact size, indices
// strictly increasing inside [lo, hi) and no NaN value.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_util.hpp"
#include "gflow/detail/kernels/topk.hpp"
#include "gflow/detail/support/oktopk_message.hpp"

namespace {

namespace k = gflow::detail::kernels;
namespace om = gflow::detail::oktopk_message;

template <class I, class W>
void run(const std::uint8_t* data, std::size_t size, std::uint64_t lo, std::uint64_t hi, std::size_t announced, std::size_t cap) {
  const auto c = om::check_count(announced, cap);
  FUZZ_CHECK(c.ok() == (announced <= cap));
  FUZZ_CHECK(!om::describe(c, announced, lo, hi).empty());
  if (!c.ok()) return;
  // An exactly-sized heap copy of the block, so any read past its end is an ASan report.
  std::unique_ptr<unsigned char[]> msg(new unsigned char[size + 1]);
  if (size) std::memcpy(msg.get(), data, size);
  std::unique_ptr<I[]> idx(new I[announced + 1]);
  std::unique_ptr<W[]> val(new W[announced + 1]);
  std::memset(idx.get(), 0xA5, (announced + 1) * sizeof(I));
  std::memset(val.get(), 0xA5, (announced + 1) * sizeof(W));
  const auto r = om::check_block<I, W>(msg.get(), size, announced, lo, hi, idx.get(), val.get(),
                                       [](const unsigned char* m, std::size_t kk, std::uint64_t l, std::uint64_t h, I* i, W* v) {
                                         return k::unpack_checked(m, kk, l, h, i, v);
                                       });
  FUZZ_CHECK(!om::describe(r, announced, lo, hi).empty());
  if (!r.ok()) {
    FUZZ_CHECK(r.count == 0);
    for (std::size_t j = 0; j <= announced; ++j) {
      unsigned char b[sizeof(I) > sizeof(W) ? sizeof(I) : sizeof(W)];
      std::memcpy(b, &idx[j], sizeof(I));
      for (std::size_t q = 0; q < sizeof(I); ++q) FUZZ_CHECK(b[q] == 0xA5);
      std::memcpy(b, &val[j], sizeof(W));
      for (std::size_t q = 0; q < sizeof(W); ++q) FUZZ_CHECK(b[q] == 0xA5);
    }
    return;
  }
  FUZZ_CHECK(size == om::block_bytes(announced, sizeof(I), sizeof(W)));
  FUZZ_CHECK(r.count == announced && r.header.count == announced && r.header.status == 0);
  for (std::size_t j = 0; j < r.count; ++j) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[j]);
    FUZZ_CHECK(i >= lo && i < hi);
    FUZZ_CHECK(j == 0 || i > static_cast<std::uint64_t>(idx[j - 1]));
    FUZZ_CHECK(!std::isnan(k::to_float(val[j])));
  }
}

template <class I>
void by_value(int w, const std::uint8_t* data, std::size_t size, std::uint64_t lo, std::uint64_t hi, std::size_t a, std::size_t cap) {
  if (w == 0) run<I, float>(data, size, lo, hi, a, cap);
  else if (w == 1) run<I, gflow::half>(data, size, lo, hi, a, cap);
  else run<I, gflow::bfloat16>(data, size, lo, hi, a, cap);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::reader in{data, size};
  const auto variant = in.take<std::uint8_t>();
  const std::uint64_t lo = in.take<std::uint16_t>();
  const std::uint64_t hi = lo + std::uint64_t{in.take<std::uint16_t>()} + 1;
  const std::size_t announced = in.take<std::uint16_t>();
  const std::size_t cap = in.take<std::uint16_t>();
  const int w = (variant >> 1) % 3;
  if (variant & 1) by_value<std::uint64_t>(w, in.p, in.n, lo, hi, announced, cap);
  else by_value<std::uint32_t>(w, in.p, in.n, lo, hi, announced, cap);
  return 0;
}
