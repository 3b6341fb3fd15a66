#pragma once
// OkTopK's exchange of one selection unit (members of detail::oktopk_engine, engine.hpp):
// boundaries, split-and-reduce, balance-and-allgatherv, the residual rule, and its checkpoint
// reader. The steps and their wire traffic are described with the tag in policies/oktopk.hpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "reduce.hpp"

namespace gflow::detail {

template <class Ctx, double Density>
template <class I>
void oktopk_engine<Ctx, Density>::run(std::size_t u, std::size_t off, std::size_t n) {
  T& t = *cx_->transport;
  const int P = t.size(), me = t.rank();
  const auto Pz = static_cast<std::size_t>(P);
  const auto mez = static_cast<std::size_t>(me);
  const std::size_t k = plan::k_for(density_, n);
  unit_state& us = units_[u];
  auto& kern = *cx_->kernels;
  index_lists<I>& L = lists<I>();
  std::vector<I>& idx = L.sel;
  // Every buffer below is a member, reserved by size_buffers (engine.hpp): no allocation here.
  std::vector<I>& F_idx = L.result;
  std::vector<W>& F_val = result_val_;

  // 1. Local selection (one pass) and the take: the residual keeps G minus what is sent.
  detail::stage_clock sc(cx_->tracer());
  const std::size_t cnt = select<I>(us, off, n, k);
  std::vector<W>& mine = mine_val_;
  mine.resize(cnt);
  I* const sel_space = space(idx, L.dsel);  // the selection where the pool kernels read it
  W* const mine_space = space(mine, dmine_);
  kern.take_selected_dropping(residual_.data(), off, n, sel_space, cnt, mine_space, scale_, unscale_, ws_);
  from_space(mine, dmine_, cnt);
  sc.lap(trace_kind::select, 0, *cx_->iteration, n * sizeof(W));
  for (std::size_t j = 0; j < cnt; ++j) selected_.push_back(static_cast<std::uint64_t>(idx[j]));
  k_total_ += k;
  ++selections_;
  const std::uint64_t cap = cap_for(k);

  // Everything below until the residual update only reads the residual: on any error (a rejected
  // message on any rank, a transport error, a timeout) this rank's own selection goes back.
  L.kept.clear();
  kept_val_.clear();
  kept_err_.clear();
  F_idx.clear();
  F_val.clear();
  try {
    // 2. Boundaries (re-estimated every boundary_period iterations, identical on every rank): each
    // rank proposes the positions that cut its own selection into P equal parts; the mean of the
    // proposals (an all_reduce of P - 1 u64) is every rank's cut.
    if (us.bounds.size() != Pz + 1 || due(params_.boundary_period)) {
      std::vector<std::uint64_t>& b = cuts_;
      const std::size_t chunk = cnt / Pz;
      for (std::size_t i = 1; i < Pz; ++i)
        b[i - 1] = chunk > 0 ? static_cast<std::uint64_t>(idx[chunk * i]) - off : static_cast<std::uint64_t>(n) * i / Pz;
      if (P > 1) {
        staged_in_place(b.data(), b.size(), [&](std::uint64_t* d) { t.all_reduce(d, b.size(), reduce_op::sum); });
        wire_bytes_ += 2 * b.size() * 8 * (Pz - 1) / Pz;  // a ring all_reduce sends 2 (P-1)/P of the buffer
        ++collectives_;
      }
      us.bounds.assign(Pz + 1, 0);
      us.bounds[Pz] = n;
      for (std::size_t i = 1; i < Pz; ++i) us.bounds[i] = std::min<std::uint64_t>(std::max(b[i - 1] / Pz, us.bounds[i - 1]), n);
      ++reest_.boundary;
    }
    const std::vector<std::uint64_t>& bd = us.bounds;
    auto lo = [&](std::size_t q) { return off + bd[q]; };
    auto hi = [&](std::size_t q) { return off + bd[q + 1]; };

    // 3. Split: this rank's entries of region q go to rank q. Counts first (all_to_all of one
    // u64 per peer), checked, then the blocks (all_to_allv).
    std::vector<std::size_t>& pos = pos_;
    pos[Pz] = cnt;
    for (std::size_t q = 0; q < Pz; ++q) pos[q] = static_cast<std::size_t>(std::lower_bound(idx.data(), idx.data() + cnt, static_cast<I>(lo(q))) - idx.data());
    for (std::size_t q = 0; q < Pz; ++q) sc_n_[q] = pos[q + 1] - pos[q];
    staged(sc_n_.data(), Pz, rc_n_.data(), Pz, [&](const std::uint64_t* sd, std::uint64_t* rd) { t.all_to_all(sd, rd, 1); });
    wire_bytes_ += 8 * (Pz - 1);
    sparse_message::header mark{};  // status != 0: this rank rejected something
    sparse_message::unpack_result own{};
    std::uint64_t own_announced = 0;
    std::size_t stotal = 0, rtotal = 0, rentries = 0;
    for (std::size_t q = 0; q < Pz; ++q) {
      sbytes_[q] = oktopk_message::block_bytes(sc_n_[q], sizeof(I), sizeof(W));
      stotal += sbytes_[q];
      if (q != mez) wire_bytes_ += sbytes_[q];
      auto r = oktopk_message::check_count(rc_n_[q], std::min<std::uint64_t>(cap, hi(mez) - lo(mez)));
      if (!r.ok() && mark.status == 0) {
        mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(q), 0};
        own = r;
        own_announced = std::min<std::uint64_t>(cap, hi(mez) - lo(mez));
      }
      rbytes_[q] = oktopk_message::block_bytes(r.ok() ? rc_n_[q] : 0, sizeof(I), sizeof(W));
      rtotal += rbytes_[q];
      rentries += r.ok() ? static_cast<std::size_t>(rc_n_[q]) : 0;
    }
    send_buf_.resize(stotal);
    recv_buf_.resize(rtotal);
    for (std::size_t q = 0, at = 0; q < Pz; at += sbytes_[q], ++q)
      sparse_message::pack(send_buf_.data() + at, sc_n_[q], idx.data() + pos[q], mine.data() + pos[q], sc_n_[q]);
    staged(send_buf_.data(), stotal, recv_buf_.data(), rtotal,
           [&](const std::uint8_t* sd, std::uint8_t* rd) { t.all_to_allv(sd, sbytes_.data(), rd, rbytes_.data()); });
    collectives_ += 2;

    // 4. Reduce region `me`: every block checked first (peer q's entries land at
    // [from_[q], from_[q + 1]) of L.recv), then the entries of each index summed in rank order
    // 0..P-1 (fp32), the same additions on every rank that owns this region (reduce.hpp).
    L.recv.resize(mark.status == 0 ? rentries : 0);
    recv_val_.resize(L.recv.size());
    from_[0] = 0;
    for (std::size_t q = 0, at = 0; q < Pz && mark.status == 0; at += rbytes_[q], ++q) {
      const std::size_t c = static_cast<std::size_t>(rc_n_[q]);
      const auto r = oktopk_message::check_block(recv_buf_.data() + at, rbytes_[q], c, lo(mez), hi(mez), L.recv.data() + from_[q], recv_val_.data() + from_[q],
                                                 [](const unsigned char* m, std::size_t kk, std::uint64_t l, std::uint64_t h, I* i, W* v) {
                                                   return kernels::unpack_checked(m, kk, l, h, i, v);
                                                 });
      if (!r.ok()) {
        mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(q), 0};
        own = r;
        own_announced = c;
        break;
      }
      from_[q + 1] = from_[q] + c;
    }
    if (mark.status == 0) reduce_by_index(L.recv.data(), recv_val_.data(), L.recv.size(), lo(mez), hi(mez), rr_, red_);
    else red_.clear();

    // 5. Keep: every reduced entry on an exact iteration (the global top-k is taken after the
    // gather), else those with |sum| >= the global threshold. Encoded in the wire type; the
    // rounding error of a kept entry stays with this rank (applied below if the entry is applied).
    const bool gexact = us.global_thr < 0.0f || due(params_.threshold_period);
    const std::uint32_t gk = gexact ? 0u : std::max<std::uint32_t>(kernels::magnitude_key(us.global_thr), 1u);
    for (const auto& [i, s] : red_) {
      if (!gexact && kernels::magnitude_key(s) < gk) continue;
      const W w = kernels::wire_cast<W>(kernels::sanitize(s));
      const float d = kernels::to_float(w);
      L.kept.push_back(static_cast<I>(i));
      kept_val_.push_back(w);
      kept_err_.push_back((std::isfinite(s) && std::isfinite(d)) ? s - d : 0.0f);
    }

    // 6. Balance-and-allgatherv: each rank's header (count, or its fault mark) to every rank,
    // then the kept blocks. Every rank sees the same bytes, so every rank reaches the same verdict.
    sparse_message::header hdr = mark;
    hdr.count = mark.status == 0 ? L.kept.size() : 0;
    staged(reinterpret_cast<const std::uint8_t*>(&hdr), sizeof hdr, reinterpret_cast<std::uint8_t*>(hdrs_.data()), sizeof hdr * Pz,
           [&](const std::uint8_t* sd, std::uint8_t* rd) { t.all_gather(sd, rd, sizeof hdr); });
    wire_bytes_ += sizeof hdr * (Pz - 1);
    ++collectives_;
    for (std::size_t q = 0; q < Pz; ++q)
      if (hdrs_[q].status != 0) {
        const auto f = static_cast<sparse_message::fault_code>(hdrs_[q].status);
        std::string what = fmt::format("Sparsifier<OkTopK>: in the split-and-reduce, rank {} rejected the block rank {} sent for its region (its {})",
                                       hdrs_[q].reporter, hdrs_[q].source, sparse_message::parameter_of(f));
        if (q == mez) what += ": " + oktopk_message::describe(own, own_announced, lo(mez), hi(mez));
        else what += "; every rank stops this exchange.";
        throw parse_error(sparse_message::parameter_of(f), what, fix_text());
      }
    std::size_t gtotal = 0, gentries = 0;
    for (std::size_t q = 0; q < Pz; ++q) {
      const std::uint64_t room = hi(q) - lo(q);
      if (hdrs_[q].count > room)
        throw parse_error("count",
                          fmt::format("Sparsifier<OkTopK>: rank {} announced {} result entries for its region [{}, {}), which holds {}.", q,
                                      hdrs_[q].count, lo(q), hi(q), room),
                          fix_text());
      gbytes_[q] = oktopk_message::block_bytes(hdrs_[q].count, sizeof(I), sizeof(W));
      gtotal += gbytes_[q];
      gentries += static_cast<std::size_t>(hdrs_[q].count);  // at most n: each count fits its region
    }
    // size_buffers covers ranks with this rank's settings (min(n, P c) entries); a peer with others
    // (a larger density or capacity) can announce up to n, checked above: grow once, never overrun.
    if (hkeys_.size() < gentries) hkeys_.resize(gentries);
    if constexpr (!on_host) {
      grow(L.dresult, gentries);
      grow(dresult_val_, gentries);
    }
    send_buf_.resize(gbytes_[mez]);
    sparse_message::pack(send_buf_.data(), L.kept.size(), L.kept.data(), kept_val_.data(), L.kept.size());
    recv_buf_.resize(gtotal);
    staged(send_buf_.data(), send_buf_.size(), recv_buf_.data(), gtotal,
           [&](const std::uint8_t* sd, std::uint8_t* rd) { t.all_gatherv(sd, send_buf_.size(), rd, gbytes_.data()); });
    wire_bytes_ += send_buf_.size() * (Pz - 1);
    ++collectives_;
    sc.lap(trace_kind::collective, 0, *cx_->iteration, gtotal);
    F_idx.resize(gentries);  // regions in rank order: increasing indices
    F_val.resize(gentries);
    for (std::size_t q = 0, at = 0, e = 0; q < Pz; at += gbytes_[q], e += static_cast<std::size_t>(hdrs_[q].count), ++q) {
      const auto c = static_cast<std::size_t>(hdrs_[q].count);
      const auto r = oktopk_message::check_block(recv_buf_.data() + at, gbytes_[q], c, lo(q), hi(q), F_idx.data() + e, F_val.data() + e,
                                                 [](const unsigned char* m, std::size_t kk, std::uint64_t l, std::uint64_t h, I* i, W* v) {
                                                   return kernels::unpack_checked(m, kk, l, h, i, v);
                                                 });
      if (!r.ok())
        throw parse_error(sparse_message::parameter_of(r.fault),
                          fmt::format("Sparsifier<OkTopK>: the result block all-gathered from rank {} was rejected: {}", q,
                                      oktopk_message::describe(r, c, lo(q), hi(q))),
                          fix_text());
    }

    // 7. The global selection: on exact iterations the k largest |value| (ties: lower index) of
    // everything gathered, and the new global threshold; else all of it, and the threshold adapts.
    if (gexact) {
      ++reest_.global;
      if (F_idx.size() > k) {
        std::vector<float>& v = mag_;
        v.resize(F_val.size());
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = kernels::to_float(F_val[j]);
        pick_.resize(k);
        // scratch: hkeys_ holds as many keys as the result has entries (size_buffers, grown above)
        const std::size_t m = kernels::select_topk(v.data(), v.size(), k, 0, pick_.data(), hkeys_.data());
        for (std::size_t j = 0; j < m; ++j) {
          F_idx[j] = F_idx[static_cast<std::size_t>(pick_[j])];
          F_val[j] = F_val[static_cast<std::size_t>(pick_[j])];
        }
        F_idx.resize(m);
        F_val.resize(m);
      }
      float tmin = std::numeric_limits<float>::infinity();
      for (const W& w : F_val) tmin = std::min(tmin, std::fabs(kernels::to_float(w)));
      us.global_thr = (!F_val.empty() && std::isfinite(tmin) && tmin > 0.0f) ? tmin : -1.0f;
    } else if (3 * F_idx.size() > 4 * k) {
      // Over 4k/3 entries passed a stale threshold (residuals grow between re-estimations): the
      // k-th largest |value| of the result, which every rank now holds, is the threshold the next
      // iteration needs. No pass over the pool, no message, the same on every rank.
      std::vector<float>& mag = mag_;
      mag.resize(F_val.size());
      for (std::size_t j = 0; j < mag.size(); ++j) mag[j] = std::fabs(kernels::to_float(F_val[j]));
      std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<float>());
      us.global_thr = mag[k - 1];
    } else if (3 * F_idx.size() < 2 * k) {
      us.global_thr /= static_cast<float>(params_.global_adapt);
    }
  } catch (...) {
    kern.restore_unselected(residual_.data(), sel_space, mine_space, cnt, static_cast<const I*>(nullptr), 0, unscale_);
    throw;
  }

  // 8. Apply and keep what was not applied. The result: F's values (averaged with an fp32 wire).
  // Residuals: a rank's own selected entries whose index is not in F go back to it whole (the
  // contributors keep their own contributions, also of regions they do not own); the owner of an
  // applied entry keeps the rounding of its 16-bit re-encoding.
  const std::size_t nf = F_idx.size();
  kern.fill_zero(cx_->grads + off, n);
  decoded_.resize(nf);
  const float post = (!Ctx::narrow && cx_->average) ? cx_->mean_scale() : 1.0f;
  to_space(L.dresult, F_idx, nf);
  to_space(dresult_val_, F_val, nf);
  I* const f_space = space(F_idx, L.dresult);
  kern.decode_scatter_counted(cx_->grads, f_space, space(F_val, dresult_val_), nf, post, decoded_.data());
  kern.restore_unselected(residual_.data(), sel_space, mine_space, cnt, f_space, nf, unscale_);
  const std::vector<I>& kept = L.kept;
  L.fix.clear();
  fix_err_.clear();
  for (std::size_t j = 0, p = 0; j < kept.size(); ++j) {
    while (p < nf && F_idx[p] < kept[j]) ++p;
    if (p < nf && F_idx[p] == kept[j] && kept_err_[j] != 0.0f) {
      const float e = kept_err_[j] * unscale_;
      if (std::isfinite(e)) {
        L.fix.push_back(kept[j]);
        fix_err_.push_back(e);
      }
    }
  }
  to_space(L.dfix, L.fix, L.fix.size());
  to_space(dfix_err_, fix_err_, fix_err_.size());
  kern.add_at(residual_.data(), space(L.fix, L.dfix), space(fix_err_, dfix_err_), L.fix.size());
  for (std::size_t j = 0; j < nf; ++j) exchanged_.push_back(static_cast<std::uint64_t>(F_idx[j]));
}

template <class Ctx, double Density>
auto oktopk_engine<Ctx, Density>::read_state(checkpoint_reader& r) const -> saved_state {
  saved_state s;
  topk_family_head h;
  read_topk_family_state(r, cx_->pool->total, h, s.residual);
  s.wide = h.wide;
  s.density = h.density;
  s.schedule = std::move(h.schedule);
  s.params = read_oktopk_params(r);
  const std::uint64_t nu = r.u64("the OkTopK unit count");
  if (nu != units_.size())
    r.fail("units", fmt::format("the checkpoint holds OkTopK state for {} selection units; this exchanger has {} (same layout and fusion expected).", nu,
                                units_.size()));
  const std::size_t P = static_cast<std::size_t>(cx_->transport->size());
  for (std::uint64_t u = 0; u < nu; ++u) {
    unit_state us;
    us.local_thr = r.f32("a local threshold");
    us.global_thr = r.f32("a global threshold");
    check_saved_oktopk_threshold(r, u, us.local_thr);
    check_saved_oktopk_threshold(r, u, us.global_thr);
    const std::size_t n = fused_ ? (*cx_->buckets)[static_cast<std::size_t>(u)].count : cx_->pool->total;
    const std::uint64_t nb = r.u64("the boundaries");
    if (nb != 0 && nb != P + 1)
      r.fail("boundaries", fmt::format("unit {} has {} region boundaries; 0 or {} (ranks + 1) expected: the checkpoint was written by a job of another size.",
                                       u, nb, P + 1));
    us.bounds.resize(nb);
    for (auto& b : us.bounds) b = r.u64("a region boundary");
    for (std::size_t i = 0; i < us.bounds.size(); ++i)
      if ((i == 0 && us.bounds[i] != 0) || (i + 1 == us.bounds.size() && us.bounds[i] != n) || (i > 0 && us.bounds[i] < us.bounds[i - 1]) || us.bounds[i] > n)
        r.fail("boundaries", fmt::format("unit {}'s region boundaries are not 0 <= ... <= {} in order (boundary {} is {}).", u, n, i, us.bounds[i]));
    s.units.push_back(std::move(us));
  }
  return s;
}

}  // namespace gflow::detail
