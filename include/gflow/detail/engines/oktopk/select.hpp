#pragma once
// OkTopK's local selection and the sizes of its buffers (members of detail::oktopk_engine,
// engine.hpp, which describes both; include engines/oktopk.hpp, not this file).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine.hpp"

namespace gflow::detail {

template <class Ctx, double Density, bool Sharded>
template <class I>
std::size_t oktopk_engine<Ctx, Density, Sharded>::select(unit_state& us, std::size_t off, std::size_t n, std::size_t k) {
  index_lists<I>& L = lists<I>();
  std::vector<I>& idx = L.sel;
  auto& kern = *cx_->kernels;
  const std::size_t cap = cap_for(k);
  const std::size_t ccap = std::min(4 * cap, n);  // candidates gathered before a second pass is needed
  idx.resize(std::min(cap, n));  // the most any path keeps (cap >= k)
  const float* g = cx_->grads + off;
  float* res = residual_.data() + off;
  I* const dsel = space(idx, L.dsel);
  bool exact = us.local_thr < 0.0f || due(params_.threshold_period);
  bool on_device_list = false;  // the selection's indices were written in the backend's memory (else: on the host)
  std::size_t cnt = 0;
  if (!exact) {
    const std::uint32_t tk = std::max<std::uint32_t>(kernels::magnitude_key(us.local_thr), 1u);  // zeros are never selected
    cand_pos_.resize(ccap);
    cand_keys_.resize(ccap);
    const std::size_t c = kern.accumulate_gather_above(g, res, n, tk, off, space(cand_pos_, dcand_pos_), space(cand_keys_, dcand_keys_), ccap);
    if (2 * c < k || c > ccap) {  // the threshold is far too high (under k/2: the gradients shrank) or far too
                                  // low (over 4 x capacity): exact top-k of the G already in the residual
      cnt = kern.select_topk(res, n, k, off, dsel, ws_);
      on_device_list = true;
      ++reest_.second_pass;
      exact = true;
    } else if (c <= cap) {  // the usual case: no keys needed (the threshold adapts, it is not re-estimated)
      from_space(cand_pos_, dcand_pos_, c);
      cnt = c;
      for (std::size_t j = 0; j < c; ++j) idx[j] = static_cast<I>(cand_pos_[j]);
    } else {  // the threshold is too low: the exact top-k among the candidates
      from_space(cand_pos_, dcand_pos_, c);
      from_space(cand_keys_, dcand_keys_, c);
      const kernels::threshold t = kernels::radix_threshold_keys(cand_keys_.data(), c, k, hkeys_.data());
      std::size_t take = t.take, m = 0;
      for (std::size_t j = 0; j < c; ++j) {
        const std::uint32_t key = cand_keys_[j];
        if (key > t.key || (key == t.key && take > 0)) {
          if (key == t.key) --take;
          sel_keys_[m] = key;
          idx[m++] = static_cast<I>(cand_pos_[j]);
        }
      }
      cnt = m;
      exact = true;
    }
  } else {
    cnt = kern.accumulate_select_topk(g, res, n, k, off, dsel, ws_).count;
    on_device_list = true;
  }
  if (on_device_list) {  // the keys of what the backend selected (G is in the residual until the take)
    kern.gather_keys(residual_.data(), dsel, cnt, space(sel_keys_, dsel_keys_));
    from_space(idx, L.dsel, cnt);
    from_space(sel_keys_, dsel_keys_, cnt);
  } else {
    to_space(L.dsel, idx, cnt);
  }
  if (exact) {
    ++reest_.local;
    // The new threshold: the smallest |G| selected (finite and > 0; else estimate again next time).
    std::uint32_t t = kernels::magnitude_key(std::numeric_limits<float>::infinity());
    for (std::size_t j = 0; j < cnt; ++j) t = std::min(t, sel_keys_[j]);  // NaN keys lie above inf's: never the minimum here
    const float tf = std::bit_cast<float>(t);
    us.local_thr = (cnt > 0 && std::isfinite(tf) && tf > 0.0f) ? tf : -1.0f;
  } else {  // adapt (the authors' rule): fewer than 2k/3 selected lowers it, more than 5k/4 raises it
    const auto a = static_cast<float>(params_.local_adapt);
    if (3 * cnt < 2 * k) us.local_thr /= a;
    else if (4 * cnt > 5 * k) us.local_thr *= a;
  }
  return cnt;
}

template <class Ctx, double Density, bool Sharded>
void oktopk_engine<Ctx, Density, Sharded>::size_buffers() {
  const double dmax = schedule_.max();
  const std::size_t P = static_cast<std::size_t>(cx_->transport->size());
  std::size_t cmax = 0, recv = 0, res = 0, sel_total = 0, res_total = 0, nmax = 0;
  auto unit = [&](std::size_t n) {
    const std::size_t k = plan::k_for(dmax, n), c = cap_for(k);
    nmax = std::max(nmax, n);
    cmax = std::max(cmax, c);
    recv = std::max(recv, P * c);
    res = std::max(res, std::min(n, P * c));
    sel_total += c;
    res_total += std::min(n, P * c);
  };
  if (fused_) {
    for (const auto& b : *cx_->buckets) unit(b.count);
  } else {
    unit(cx_->pool->total);
  }
  if (wide_) {
    l32_ = {};
    l64_.reserve(4 * cmax, recv, res);
  } else {
    l64_ = {};
    l32_.reserve(4 * cmax, recv, res);
  }
  cand_pos_.reserve(4 * cmax);
  cand_keys_.reserve(4 * cmax);
  if (sel_keys_.size() < 4 * cmax) sel_keys_.assign(4 * cmax, 0);
  if (hkeys_.size() < 4 * cmax) hkeys_.assign(4 * cmax, 0);  // the candidates' radix scratch
  fix_err_.reserve(res);
  mine_val_.reserve(cmax);
  recv_val_.reserve(recv);
  red_.reserve(res);
  kept_val_.reserve(res);
  kept_err_.reserve(res);
  result_val_.reserve(res);
  decoded_.reserve(res);
  red_keys_.reserve(res);
  level_keys_.reserve(res);
  const std::size_t msg = P * sparse_message::header_bytes + recv * (this->index_bytes() + sizeof(W));
  send_buf_.reserve(msg);
  recv_buf_.reserve(msg);
  selected_.reserve(sel_total);
  exchanged_.reserve(res_total);
  cuts_.assign(P > 1 ? P - 1 : 0, 0);
  pos_.assign(P + 1, 0);
  from_.assign(P + 1, 0);
  sc_n_.assign(P, 0);
  rc_n_.assign(P, 0);
  sbytes_.assign(P, 0);
  rbytes_.assign(P, 0);
  gbytes_.assign(P, 0);
  anns_.assign(P, oktopk_message::announcement{});
  gcount_.assign(P, 0);
  constexpr std::uint64_t packed_max = std::uint64_t{1} << 32;  // reduce.hpp's one-word entries: offsets and positions below 2^32
  rr_.reserve(recv, nmax > packed_max || recv > packed_max);
  if constexpr (!on_host) {  // the device copies, and the staging buffer of the collectives
    grow(dcand_pos_, 4 * cmax);
    grow(dcand_keys_, 4 * cmax);
    grow(dsel_keys_, 4 * cmax);
    grow(dmine_, cmax);
    grow(dresult_val_, res);
    grow(dfix_err_, res);
    if constexpr (Sharded) grow(dred_val_, res);
    grow(stage_, 2 * msg + 2 * (P + 1) * sparse_message::header_bytes + 1024);
  }
}

}  // namespace gflow::detail
