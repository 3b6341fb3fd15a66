// The Top-k sparse message (gflow/detail/support/sparse_message.hpp): pack, and unpack_checked's every rejection.
#include <doctest/doctest.h>

#include <gflow/detail/kernels/topk.hpp>
#include <gflow/detail/support/sparse_message.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace gflow;
namespace k_ = gflow::detail::kernels;

TEST_CASE_TEMPLATE("pack / unpack_checked round trip and every rejection", I, std::uint32_t, std::uint64_t) {
  const std::size_t k = 5;
  std::vector<unsigned char> msg(gflow::detail::sparse_message::bytes(k, sizeof(I), sizeof(float)));
  CHECK(msg.size() == 24 + 5 * (sizeof(I) + 4));
  const I idx[] = {10, 12, 19};
  const float val[] = {1.5f, -2.0f, 0.25f};
  gflow::detail::sparse_message::pack(msg.data(), k, idx, val, 3);
  I ri[k];
  float rv[k];
  auto r = k_::unpack_checked(msg.data(), k, 10, 20, ri, rv);
  REQUIRE(r.ok());
  CHECK(r.count == 3);
  CHECK(ri[2] == 19);
  CHECK(rv[1] == -2.0f);

  auto rejected = [&](std::vector<unsigned char> m, gflow::detail::sparse_message::fault_code f, std::uint64_t lo = 10, std::uint64_t hi = 20) {
    I si[k];
    float sv[k];
    std::fill(si, si + k, I{77});
    std::fill(sv, sv + k, 77.0f);
    auto rr = k_::unpack_checked(m.data(), k, lo, hi, si, sv);
    CHECK(rr.fault == f);
    CHECK(rr.count == 0);
    CHECK(std::all_of(si, si + k, [](I x) { return x == 77; }));  // nothing written on rejection
    CHECK(std::all_of(sv, sv + k, [](float x) { return x == 77.0f; }));
    CHECK(!gflow::detail::sparse_message::describe(rr, k, lo, hi).empty());
  };
  rejected(msg, gflow::detail::sparse_message::fault_code::index, 11, 20);  // 10 below lo
  rejected(msg, gflow::detail::sparse_message::fault_code::index, 10, 19);  // 19 at hi
  {
    auto m = msg;
    const std::uint64_t c = 6;
    std::memcpy(m.data(), &c, 8);
    rejected(m, gflow::detail::sparse_message::fault_code::count);
  }
  {
    const I dup[] = {10, 12, 12};
    auto m = msg;
    gflow::detail::sparse_message::pack(m.data(), k, dup, val, 3);
    rejected(m, gflow::detail::sparse_message::fault_code::order);
    const I down[] = {10, 14, 12};
    gflow::detail::sparse_message::pack(m.data(), k, down, val, 3);
    rejected(m, gflow::detail::sparse_message::fault_code::order);
  }
  {
    const float bad[] = {1.0f, std::nanf(""), 2.0f};
    auto m = msg;
    gflow::detail::sparse_message::pack(m.data(), k, idx, bad, 3);
    rejected(m, gflow::detail::sparse_message::fault_code::value);
    const float inf[] = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
    gflow::detail::sparse_message::pack(m.data(), k, idx, inf, 3);
    CHECK(k_::unpack_checked(m.data(), k, 10, 20, ri, rv).ok());  // inf is a value, reported by finish()
  }
  {
    auto m = msg;
    gflow::detail::sparse_message::pack(m.data(), k, idx, val, 3, gflow::detail::sparse_message::header{0, 2, 4, 5, 1});
    rejected(m, gflow::detail::sparse_message::fault_code::status);
  }
  // 16-bit NaN values are rejected too
  std::vector<unsigned char> m16(gflow::detail::sparse_message::bytes(k, sizeof(I), 2));
  const half hv[] = {k_::to_half(1.0f), half{0x7e00}, k_::to_half(2.0f)};
  gflow::detail::sparse_message::pack(m16.data(), k, idx, hv, 3);
  half hr[k];
  CHECK(k_::unpack_checked(m16.data(), k, 10, 20, ri, hr).fault == gflow::detail::sparse_message::fault_code::value);
  const bfloat16 bv[] = {k_::to_bfloat16(1.0f), k_::to_bfloat16(2.0f), bfloat16{0x7fc1}};
  gflow::detail::sparse_message::pack(m16.data(), k, idx, bv, 3);
  bfloat16 br[k];
  CHECK(k_::unpack_checked(m16.data(), k, 10, 20, ri, br).fault == gflow::detail::sparse_message::fault_code::value);
}
