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

namespace gflow::detail {

template <class Ctx, double Density>
template <class I>
void oktopk_engine<Ctx, Density>::run(std::size_t u, std::size_t off, std::size_t n) {
  T& t = *cx_->transport;
  const int P = t.size(), me = t.rank();
  const auto Pz = static_cast<std::size_t>(P);
  const std::size_t k = plan::k_for(density_, n);
  unit_state& us = units_[u];
  auto& kern = *cx_->kernels;
  std::vector<I>& idx = idx_buf<I>();

  // 1. Local selection (one pass) and the take: the residual keeps G minus what is sent.
  detail::stage_clock sc(cx_->tracer());
  const std::size_t cnt = select<I>(us, off, n, k);
  std::vector<W>& mine = mine_val_;
  mine.resize(cnt);
  kern.take_selected_dropping(residual_.data(), off, n, idx.data(), cnt, mine.data(), scale_, unscale_, ws_);
  sc.lap(trace_kind::select, 0, *cx_->iteration, n * sizeof(W));
  for (std::size_t j = 0; j < cnt; ++j) selected_.push_back(static_cast<std::uint64_t>(idx[j]));
  k_total_ += k;
  ++selections_;
  const std::uint64_t cap = std::max<std::uint64_t>(k, static_cast<std::uint64_t>(std::ceil(params_.capacity * static_cast<double>(k))));

  // Everything below until the residual update only reads the residual: on any error (a rejected
  // message on any rank, a transport error, a timeout) this rank's own selection goes back.
  std::vector<I> F_idx, tmp_idx_, kept_idx_;
  std::vector<W> F_val, tmp_val_, kept_val_;
  std::vector<float> kept_err_;
  try {
    // 2. Boundaries (re-estimated every boundary_period iterations, identical on every rank): each
    // rank proposes the positions that cut its own selection into P equal parts; the mean of the
    // proposals (an all_reduce of P - 1 u64) is every rank's cut.
    if (us.bounds.size() != Pz + 1 || due(params_.boundary_period)) {
      std::vector<std::uint64_t> b(Pz > 1 ? Pz - 1 : 0);
      const std::size_t chunk = cnt / Pz;
      for (std::size_t i = 1; i < Pz; ++i)
        b[i - 1] = chunk > 0 ? static_cast<std::uint64_t>(idx[chunk * i]) - off : static_cast<std::uint64_t>(n) * i / Pz;
      if (P > 1) {
        t.all_reduce(b.data(), b.size(), reduce_op::sum);
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
    std::vector<std::size_t> pos(Pz + 1, cnt);
    for (std::size_t q = 0; q < Pz; ++q) pos[q] = static_cast<std::size_t>(std::lower_bound(idx.data(), idx.data() + cnt, static_cast<I>(lo(q))) - idx.data());
    std::vector<std::uint64_t> sc_n(Pz), rc_n(Pz);
    for (std::size_t q = 0; q < Pz; ++q) sc_n[q] = pos[q + 1] - pos[q];
    t.all_to_all(sc_n.data(), rc_n.data(), 1);
    wire_bytes_ += 8 * (Pz - 1);
    sparse_message::header mark{};  // status != 0: this rank rejected something
    sparse_message::unpack_result own{};
    std::uint64_t own_announced = 0;
    std::vector<std::size_t> sbytes(Pz), rbytes(Pz);
    std::size_t stotal = 0, rtotal = 0;
    for (std::size_t q = 0; q < Pz; ++q) {
      sbytes[q] = oktopk_message::block_bytes(sc_n[q], sizeof(I), sizeof(W));
      stotal += sbytes[q];
      if (q != static_cast<std::size_t>(me)) wire_bytes_ += sbytes[q];
      auto r = oktopk_message::check_count(rc_n[q], std::min<std::uint64_t>(cap, hi(me) - lo(me)));
      if (!r.ok() && mark.status == 0) {
        mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(q), 0};
        own = r;
        own_announced = std::min<std::uint64_t>(cap, hi(me) - lo(me));
      }
      rbytes[q] = oktopk_message::block_bytes(r.ok() ? rc_n[q] : 0, sizeof(I), sizeof(W));
      rtotal += rbytes[q];
    }
    send_buf_.resize(stotal);
    recv_buf_.resize(rtotal);
    for (std::size_t q = 0, at = 0; q < Pz; at += sbytes[q], ++q)
      kern.pack(send_buf_.data() + at, sc_n[q], idx.data() + pos[q], mine.data() + pos[q], sc_n[q]);
    t.all_to_allv(send_buf_.data(), sbytes.data(), recv_buf_.data(), rbytes.data());
    collectives_ += 2;

    // 4. Reduce region `me`: every block checked first, then the entries summed in rank order
    // 0..P-1 (fp32), the same additions on every rank that owns this region.
    red_.clear();
    for (std::size_t q = 0, at = 0; q < Pz && mark.status == 0; at += rbytes[q], ++q) {
      const std::size_t c = static_cast<std::size_t>(rc_n[q]);
      tmp_idx_.resize(c);
      tmp_val_.resize(c);
      const auto r = oktopk_message::check_block(recv_buf_.data() + at, rbytes[q], c, lo(me), hi(me), tmp_idx_.data(), tmp_val_.data(),
                                                 [](const unsigned char* m, std::size_t kk, std::uint64_t l, std::uint64_t h, I* i, W* v) {
                                                   return kernels::unpack_checked(m, kk, l, h, i, v);
                                                 });
      if (!r.ok()) {
        mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(q), 0};
        own = r;
        own_announced = c;
        break;
      }
      for (std::size_t j = 0; j < c; ++j) red_.push_back({static_cast<std::uint64_t>(tmp_idx_[j]), kernels::to_float(tmp_val_[j])});
    }
    std::stable_sort(red_.begin(), red_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::size_t nr = 0;
    for (std::size_t j = 0; j < red_.size(); ++j) {
      if (nr > 0 && red_[nr - 1].first == red_[j].first) red_[nr - 1].second += red_[j].second;
      else red_[nr++] = red_[j];
    }
    red_.resize(mark.status == 0 ? nr : 0);

    // 5. Keep: every reduced entry on an exact iteration (the global top-k is taken after the
    // gather), else those with |sum| >= the global threshold. Encoded in the wire type; the
    // rounding error of a kept entry stays with this rank (applied below if the entry is applied).
    const bool gexact = us.global_thr < 0.0f || due(params_.threshold_period);
    const std::uint32_t gk = gexact ? 0u : std::max<std::uint32_t>(kernels::magnitude_key(us.global_thr), 1u);
    kept_idx_.clear();
    kept_val_.clear();
    kept_err_.clear();
    for (const auto& [i, s] : red_) {
      if (!gexact && kernels::magnitude_key(s) < gk) continue;
      const W w = kernels::wire_cast<W>(kernels::sanitize(s));
      const float d = kernels::to_float(w);
      kept_idx_.push_back(static_cast<I>(i));
      kept_val_.push_back(w);
      kept_err_.push_back((std::isfinite(s) && std::isfinite(d)) ? s - d : 0.0f);
    }

    // 6. Balance-and-allgatherv: each rank's header (count, or its fault mark) to every rank,
    // then the kept blocks. Every rank sees the same bytes, so every rank reaches the same verdict.
    sparse_message::header hdr = mark;
    hdr.count = mark.status == 0 ? kept_idx_.size() : 0;
    std::vector<sparse_message::header> hdrs(Pz);
    t.all_gather(reinterpret_cast<const std::uint8_t*>(&hdr), reinterpret_cast<std::uint8_t*>(hdrs.data()), sizeof hdr);
    wire_bytes_ += sizeof hdr * (Pz - 1);
    ++collectives_;
    for (std::size_t q = 0; q < Pz; ++q)
      if (hdrs[q].status != 0) {
        const auto f = static_cast<sparse_message::fault_code>(hdrs[q].status);
        std::string what = fmt::format("Sparsifier<OkTopK>: in the split-and-reduce, rank {} rejected the block rank {} sent for its region (its {})",
                                       hdrs[q].reporter, hdrs[q].source, sparse_message::parameter_of(f));
        if (q == static_cast<std::size_t>(me)) what += ": " + oktopk_message::describe(own, own_announced, lo(me), hi(me));
        else what += "; every rank stops this exchange.";
        throw parse_error(sparse_message::parameter_of(f), what, fix_text());
      }
    std::vector<std::size_t> gbytes(Pz);
    std::size_t gtotal = 0;
    for (std::size_t q = 0; q < Pz; ++q) {
      const std::uint64_t room = hi(q) - lo(q);
      if (hdrs[q].count > room)
        throw parse_error("count",
                          fmt::format("Sparsifier<OkTopK>: rank {} announced {} result entries for its region [{}, {}), which holds {}.", q,
                                      hdrs[q].count, lo(q), hi(q), room),
                          fix_text());
      gbytes[q] = oktopk_message::block_bytes(hdrs[q].count, sizeof(I), sizeof(W));
      gtotal += gbytes[q];
    }
    send_buf_.resize(gbytes[static_cast<std::size_t>(me)]);
    kern.pack(send_buf_.data(), kept_idx_.size(), kept_idx_.data(), kept_val_.data(), kept_idx_.size());
    recv_buf_.resize(gtotal);
    t.all_gatherv(send_buf_.data(), send_buf_.size(), recv_buf_.data(), gbytes.data());
    wire_bytes_ += send_buf_.size() * (Pz - 1);
    ++collectives_;
    sc.lap(trace_kind::collective, 0, *cx_->iteration, gtotal);
    for (std::size_t q = 0, at = 0; q < Pz; at += gbytes[q], ++q) {
      const auto c = static_cast<std::size_t>(hdrs[q].count);
      tmp_idx_.resize(c);
      tmp_val_.resize(c);
      const auto r = oktopk_message::check_block(recv_buf_.data() + at, gbytes[q], c, lo(q), hi(q), tmp_idx_.data(), tmp_val_.data(),
                                                 [](const unsigned char* m, std::size_t kk, std::uint64_t l, std::uint64_t h, I* i, W* v) {
                                                   return kernels::unpack_checked(m, kk, l, h, i, v);
                                                 });
      if (!r.ok())
        throw parse_error(sparse_message::parameter_of(r.fault),
                          fmt::format("Sparsifier<OkTopK>: the result block all-gathered from rank {} was rejected: {}", q,
                                      oktopk_message::describe(r, c, lo(q), hi(q))),
                          fix_text());
      F_idx.insert(F_idx.end(), tmp_idx_.begin(), tmp_idx_.end());  // regions in rank order: increasing indices
      F_val.insert(F_val.end(), tmp_val_.begin(), tmp_val_.end());
    }

    // 7. The global selection: on exact iterations the k largest |value| (ties: lower index) of
    // everything gathered, and the new global threshold; else all of it, and the threshold adapts.
    if (gexact) {
      ++reest_.global;
      if (F_idx.size() > k) {
        std::vector<float> v(F_val.size());
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = kernels::to_float(F_val[j]);
        std::vector<std::uint32_t> scratch(v.size());
        std::vector<std::uint64_t> pick(k);
        const std::size_t m = kernels::select_topk(v.data(), v.size(), k, 0, pick.data(), scratch.data());
        for (std::size_t j = 0; j < m; ++j) {
          F_idx[j] = F_idx[static_cast<std::size_t>(pick[j])];
          F_val[j] = F_val[static_cast<std::size_t>(pick[j])];
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
      std::vector<float> mag(F_val.size());
      for (std::size_t j = 0; j < mag.size(); ++j) mag[j] = std::fabs(kernels::to_float(F_val[j]));
      std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<float>());
      us.global_thr = mag[k - 1];
    } else if (3 * F_idx.size() < 2 * k) {
      us.global_thr /= static_cast<float>(params_.global_adapt);
    }
  } catch (...) {
    kernels::restore_unselected(residual_.data(), idx.data(), mine.data(), cnt, static_cast<const I*>(nullptr), 0, unscale_);
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
  kern.decode_scatter_counted(cx_->grads, F_idx.data(), F_val.data(), nf, post, decoded_.data());
  kern.restore_unselected(residual_.data(), idx.data(), mine.data(), cnt, F_idx.data(), nf, unscale_);
  for (std::size_t j = 0, p = 0; j < kept_idx_.size(); ++j) {
    while (p < nf && F_idx[p] < kept_idx_[j]) ++p;
    if (p < nf && F_idx[p] == kept_idx_[j] && kept_err_[j] != 0.0f) {
      const float e = kept_err_[j] * unscale_;
      if (std::isfinite(e)) residual_[static_cast<std::size_t>(kept_idx_[j])] += e;
    }
  }
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
  s.params.threshold_period = r.u64("threshold_period");
  s.params.boundary_period = r.u64("boundary_period");
  s.params.local_adapt = r.f64("local_adapt");
  s.params.global_adapt = r.f64("global_adapt");
  s.params.capacity = r.f64("capacity");
  try {
    check_oktopk_params(s.params);
  } catch (const invalid_argument& e) {
    r.fail(e.subject(), std::string("the checkpoint's OkTopK parameters are invalid: ") + e.what());
  }
  const std::uint64_t nu = r.u64("the OkTopK unit count");
  if (nu != units_.size())
    r.fail("units", fmt::format("the checkpoint holds OkTopK state for {} selection units; this exchanger has {} (same layout and fusion expected).", nu,
                                units_.size()));
  const std::size_t P = static_cast<std::size_t>(cx_->transport->size());
  for (std::uint64_t u = 0; u < nu; ++u) {
    unit_state us;
    us.local_thr = r.f32("a local threshold");
    us.global_thr = r.f32("a global threshold");
    const float ths[2] = {us.local_thr, us.global_thr};  // (a braced list in the range-for trips nvcc's front end)
    for (const float th : ths)
      if (!(std::isfinite(th) && (th >= 0.0f || th == -1.0f)))
        r.fail("threshold", fmt::format("unit {} has threshold {:f} (finite and >= 0, or -1 for not estimated, expected).", u, th));
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
