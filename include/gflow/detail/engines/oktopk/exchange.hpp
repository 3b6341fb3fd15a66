#pragma once
// OkTopK's exchange of one selection unit (members of detail::oktopk_engine, engine.hpp):
// boundaries, split-and-reduce, the global cut (cut.hpp), the allgatherv, the residual rule, and
// its checkpoint reader. The steps and their wire traffic are described with the tag in policies/oktopk.hpp.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cut.hpp"
#include "engine.hpp"
#include "reduce.hpp"

namespace gflow::detail {

template <class Ctx, double Density, bool Sharded>
template <class I>
void oktopk_engine<Ctx, Density, Sharded>::run(std::size_t u, std::size_t off, std::size_t n) {
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
    if constexpr (Sharded) {
      // Sharded: the regions are the shard plan's blocks of this bucket (u is its index; fixed, no
      // collective), so region `me` is this rank's shard of it.
      const std::size_t* c = cx_->shards->counts_of(u);
      us.bounds.resize(Pz + 1);  // reserved by replan: no allocation
      us.bounds[0] = 0;
      for (std::size_t q = 0; q < Pz; ++q) us.bounds[q + 1] = us.bounds[q] + c[q];
    } else if (us.bounds.size() != Pz + 1 || due(params_.boundary_period)) {
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
    oktopk_message::announcement mark{};  // status != 0: this rank rejected something
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

    // Every rank's announcement (all_gather): a fault mark on any rank stops every rank with the
    // same parse_error.
    auto announce = [&](const oktopk_message::announcement& a) {
      staged(reinterpret_cast<const std::uint8_t*>(&a), sizeof a, reinterpret_cast<std::uint8_t*>(anns_.data()), sizeof a * Pz,
             [&](const std::uint8_t* sd, std::uint8_t* rd) { t.all_gather(sd, rd, sizeof a); });
      wire_bytes_ += sizeof a * (Pz - 1);
      ++collectives_;
      for (std::size_t q = 0; q < Pz; ++q)
        if (anns_[q].status != 0) {
          const auto f = static_cast<sparse_message::fault_code>(anns_[q].status);
          std::string what = fmt::format("Sparsifier<OkTopK>: in the split-and-reduce, rank {} rejected the block rank {} sent for its region (its {})",
                                         anns_[q].reporter, anns_[q].source, sparse_message::parameter_of(f));
          if (q == mez) what += ": " + oktopk_message::describe(own, own_announced, lo(mez), hi(mez));
          else what += "; every rank stops this exchange.";
          throw parse_error(sparse_message::parameter_of(f), what, fix_text());
        }
    };
    if constexpr (Sharded) {
      // Sharded: no cut and no all_gatherv; the fault marks only (written into the shard below).
      announce(mark);
      sc.lap(trace_kind::collective, 0, *cx_->iteration, rtotal);
    } else {
      // 5. The global cut (cut.hpp): every rank counts its region's sums by level, the counts are
      // summed over ranks (one all_reduce of 32 counts per round: one round while the previous
      // iteration's level still frames the k-th largest, else a coarse and a fine one), and every
      // rank reaches the same cut: exactly k sums kept over all regions, or every nonzero one.
      std::vector<std::uint32_t>& keys = red_keys_;
      keys.resize(red_.size());
      for (std::size_t j = 0; j < red_.size(); ++j) keys[j] = kernels::magnitude_key(red_[j].second);
      auto count_round = [&](oktopk_cut::round r) {
        std::array<I, oktopk_cut::slots> h{};
        for (const std::uint32_t key : keys) {
          const std::uint32_t s = key == 0 ? oktopk_cut::slots : oktopk_cut::slot_of(r, oktopk_cut::level_of(key));
          if (s < oktopk_cut::slots) ++h[s];
        }
        if (P > 1) {
          staged_in_place(h.data(), h.size(), [&](I* d) { t.all_reduce(d, h.size(), reduce_op::sum); });
          wire_bytes_ += 2 * h.size() * sizeof(I) * (Pz - 1) / Pz;  // a ring all_reduce sends 2 (P-1)/P of the buffer
          ++collectives_;
        }
        return h;
      };
      oktopk_cut::cut cut = oktopk_cut::keep_all;
      bool settled = false;
      if (us.global_thr >= 0.0f) {
        const std::uint32_t lo = oktopk_cut::window_lo(oktopk_cut::level_of(kernels::magnitude_key(us.global_thr)));
        const auto h = count_round({oktopk_cut::round_kind::window, lo});
        const auto v = oktopk_cut::settle_window(h.data(), lo, k);
        cut = v.c;
        settled = v.settled;
      }
      if (!settled) {
        ++reest_.global;
        const auto hc = count_round({oktopk_cut::round_kind::coarse, 0});
        const auto f = oktopk_cut::find(hc.data(), 0, k);
        if (!f.all) {
          const auto hf = count_round({oktopk_cut::round_kind::fine, f.slot});
          cut = oktopk_cut::settle_fine(hf.data(), f.slot, f.above, k);
        }
      }

      // 6. Announce: how many sums lie above the cut's level and how many at it (or the fault mark
      // of a rejected split block). Every rank sees the same bytes, so every rank reaches the same
      // verdict and the same counts: rank q's block holds its sums above the level and its share of
      // the allowance at the level (allotted in rank order).
      oktopk_message::announcement ann = mark;
      std::size_t at_level = 0;
      if (mark.status == 0) {
        for (const std::uint32_t key : keys) {
          if (key == 0) continue;
          const std::uint32_t lv = oktopk_cut::level_of(key);
          ann.above += lv > cut.level;
          at_level += lv == cut.level;
        }
        ann.at_cut = static_cast<std::uint32_t>(std::min<std::uint64_t>({at_level, cut.allowance, std::numeric_limits<std::uint32_t>::max()}));
      }
      announce(ann);
      std::size_t gtotal = 0, gentries = 0;
      std::uint64_t my_take = 0;
      oktopk_cut::allotter allot(cut);
      for (std::size_t q = 0; q < Pz; ++q) {
        const std::uint64_t room = hi(q) - lo(q);
        if (anns_[q].above > room || anns_[q].at_cut > room - anns_[q].above)
          throw parse_error("count",
                            fmt::format("Sparsifier<OkTopK>: rank {} announced {} + {} result entries for its region [{}, {}), which holds {}.", q,
                                        anns_[q].above, anns_[q].at_cut, lo(q), hi(q), room),
                            fix_text());
        const std::uint64_t take = allot.next(anns_[q].at_cut);
        if (q == mez) my_take = take;
        gcount_[q] = anns_[q].above + take;
        gbytes_[q] = oktopk_message::block_bytes(gcount_[q], sizeof(I), sizeof(W));
        gtotal += gbytes_[q];
        gentries += static_cast<std::size_t>(gcount_[q]);  // at most n: each count fits its region
      }

      // 7. Keep what this rank's block holds: every sum above the level and, at the level, its
      // my_take largest (equal magnitudes: lower index first). Encoded in the wire type; the
      // rounding error of a kept entry stays with this rank (applied below if the entry is applied).
      const bool whole_level = my_take >= at_level;
      std::uint32_t tie_key = std::numeric_limits<std::uint32_t>::max();  // my_take == 0: none of the level (every key lies below)
      std::uint64_t ties = 0;  // at the level: every key above tie_key, and the first `ties` equal to it
      if (!whole_level && my_take > 0) {
        std::vector<std::uint32_t>& lk = level_keys_;
        lk.clear();
        for (const std::uint32_t key : keys)
          if (key != 0 && oktopk_cut::level_of(key) == cut.level) lk.push_back(key);
        std::nth_element(lk.begin(), lk.begin() + static_cast<std::ptrdiff_t>(my_take - 1), lk.end(), std::greater<std::uint32_t>());
        tie_key = lk[static_cast<std::size_t>(my_take - 1)];
        std::uint64_t greater = 0;
        for (const std::uint32_t key : lk) greater += key > tie_key;
        ties = my_take - greater;
      }
      for (std::size_t j = 0; j < red_.size() && mark.status == 0; ++j) {
        const std::uint32_t key = keys[j];
        if (key == 0) continue;
        const std::uint32_t lv = oktopk_cut::level_of(key);
        if (lv < cut.level) continue;
        if (lv == cut.level && !whole_level) {
          if (key < tie_key) continue;
          if (key == tie_key) {
            if (ties == 0) continue;
            --ties;
          }
        }
        const float s = red_[j].second;
        const W w = kernels::wire_cast<W>(kernels::sanitize(s));
        const float d = kernels::to_float(w);
        L.kept.push_back(static_cast<I>(red_[j].first));
        kept_val_.push_back(w);
        kept_err_.push_back((std::isfinite(s) && std::isfinite(d)) ? s - d : 0.0f);
      }
      if (L.kept.size() != gcount_[mez])
        throw parse_error("count", fmt::format("Sparsifier<OkTopK>: this rank kept {} result entries where its announcement gave {}.", L.kept.size(), gcount_[mez]),
                          fix_text());

      // 8. The all_gatherv of the blocks; every rank checks every block. The result F is their
      // union (increasing indices, regions in rank order), the same on every rank.
      // size_buffers covers ranks with this rank's settings (min(n, P c) entries); a peer with others
      // (a larger density or capacity) can announce up to n, checked above: grow once, never overrun.
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
      F_idx.resize(gentries);
      F_val.resize(gentries);
      for (std::size_t q = 0, at = 0, e = 0; q < Pz; at += gbytes_[q], e += static_cast<std::size_t>(gcount_[q]), ++q) {
        const auto c = static_cast<std::size_t>(gcount_[q]);
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
      // The next window's centre: the cut's level; with every sum kept, the smallest kept
      // magnitude's (the same on every rank: every rank holds F).
      if (!cut.keep_all) {
        us.global_thr = std::bit_cast<float>(oktopk_cut::level_floor(std::min(cut.level, oktopk_cut::finite_levels - 1)));
      } else if (!F_val.empty()) {
        std::uint32_t m = std::numeric_limits<std::uint32_t>::max();
        for (const W& w : F_val) m = std::min(m, kernels::magnitude_key(kernels::to_float(w)));
        us.global_thr = std::bit_cast<float>(oktopk_cut::level_floor(std::min(oktopk_cut::level_of(m), oktopk_cut::finite_levels - 1)));
      }
    }
  } catch (...) {
    kern.restore_unselected(residual_.data(), sel_space, mine_space, cnt, static_cast<const I*>(nullptr), 0, unscale_);
    throw;
  }

  if constexpr (Sharded) {
    write_shard<I>(u);
    return;
  }

  // 9. Apply and keep what was not applied. The result: F's values (averaged with an fp32 wire).
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

// Sharded: this rank's block of bucket u becomes the region's sums (red_, by index): zeroed, then
// each sum written at its index (NaN as +inf, as the unsharded result sends it; divided by P with
// an fp32 wire and averaging: Dense's one multiply; with a 16-bit wire the senders divided before
// the cast). Counted for finish()'s inf / NaN report, which sums the ranks' shards.
template <class Ctx, double Density, bool Sharded>
template <class I>
void oktopk_engine<Ctx, Density, Sharded>::write_shard(std::size_t u) {
  auto& kern = *cx_->kernels;
  index_lists<I>& L = lists<I>();
  const std::size_t nr = red_.size();
  const float post = (!Ctx::narrow && cx_->average) ? cx_->mean_scale() : 1.0f;
  L.result.resize(nr);
  decoded_.resize(nr);
  for (std::size_t j = 0; j < nr; ++j) {
    L.result[j] = static_cast<I>(red_[j].first);
    decoded_[j] = kernels::sanitize(red_[j].second) * post;
  }
  const plan::pool_range mine = cx_->shards->mine[u];
  kern.fill_zero(cx_->grads + mine.begin, mine.size());
  to_space(L.dresult, L.result, nr);
  to_space(dred_val_, decoded_, nr);
  const float* vals = space(decoded_, dred_val_);
  kern.add_at(cx_->grads, space(L.result, L.dresult), vals, nr);  // 0 + v: v's bits
  kern.count_nonfinite(vals, nr);
  for (std::size_t j = 0; j < nr; ++j) exchanged_.push_back(static_cast<std::uint64_t>(L.result[j]));
}

template <class Ctx, double Density, bool Sharded>
auto oktopk_engine<Ctx, Density, Sharded>::read_state(checkpoint_reader& r) const -> saved_state {
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
