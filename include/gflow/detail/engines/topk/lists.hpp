#pragma once
// detail::topk_lists: the Top-k engine's typed scratch lists for one index width, in the
// backend's memory (engines/topk/engine.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gflow::detail {

// Typed scratch for one index width (u32 or u64), in the backend's memory; only the width in use
// is allocated.
template <class I, class W, class B>
struct topk_lists {
  template <class E>
  using buf = typename B::template buffer<E>;
  buf<I> mine_idx, cur_idx, tmp_idx, recv_idx;
  buf<W> mine_val, cur_val, tmp_val, recv_val;
  buf<I> u_idx;                       // merge union, 2k (host merge scratch)
  buf<float> u_sum;                   // 2k
  buf<std::uint32_t> u_key;           // 2k
  buf<I> rec_idx;                     // merge records, rounds x 2k
  buf<float> rec_val;
  std::vector<std::size_t> rec_count; // per round (host)

  void size_for(std::size_t k, int rounds, bool global) {
    mine_idx = buf<I>(k);
    recv_idx = buf<I>(k);
    mine_val = buf<W>(k);
    recv_val = buf<W>(k);
    if (global) {
      cur_idx = buf<I>(k);
      tmp_idx = buf<I>(k);
      cur_val = buf<W>(k);
      tmp_val = buf<W>(k);
      u_idx = buf<I>(2 * k);
      u_sum = buf<float>(2 * k);
      u_key = buf<std::uint32_t>(2 * k);
      rec_idx = buf<I>(static_cast<std::size_t>(rounds) * 2 * k);
      rec_val = buf<float>(static_cast<std::size_t>(rounds) * 2 * k);
      rec_count.assign(static_cast<std::size_t>(rounds), 0);
    }
  }
  void release() { *this = topk_lists{}; }
};

}  // namespace gflow::detail
