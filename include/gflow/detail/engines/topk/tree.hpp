#pragma once
// GTopK's exchange of one selection unit: ceil(log2 P) rounds of pairwise merges towards rank 0
// (plan/tree.hpp), then a broadcast of the global top-k, and the error a failed exchange throws
// (members of detail::topk_engine, engines/topk/engine.hpp).
#include <cstddef>
#include <string>

#include "engine.hpp"
#include "../../../error.hpp"

namespace gflow::detail {

// ---- GTopK: tree of merges, then a broadcast --------------------------------------------
template <class Ctx, double Density, bool Global>
template <class I>
void topk_engine<Ctx, Density, Global>::run_global(std::size_t off, std::size_t n, std::size_t k, std::size_t mb, std::size_t cnt) {
  auto& L = lists<I>();
  auto& kern = *cx_->kernels;
  T& t = *cx_->transport;
  const int rank = t.rank();
  kern.copy_n(L.cur_idx.data(), L.mine_idx.data(), cnt);
  kern.copy_n(L.cur_val.data(), L.mine_val.data(), cnt);
  std::size_t cur = cnt;
  detail::stage_clock sc(cx_->tracer());  // timeline: the tree's rounds and the broadcast, as one collective span
  sparse_message::header mark{};  // status != 0 once this rank saw a bad message (or a marked one)
  sparse_message::unpack_result own{};    // what this rank itself rejected
  int own_peer = -1;
  for (std::size_t j = 0; j < steps_.size(); ++j) {
    const plan::tree_step& s = steps_[j];
    L.rec_count[j] = 0;
    if (s.role == plan::tree_role::receive) {
      t.recv(recv_msg_.data(), mb, s.peer);
      // Device memory: the verdict (and below the merge's counts) come to the host, because the
      // host decides whether to merge or forward a fault and how many entries the next message holds.
      const auto r = kern.unpack_checked(recv_msg_.data(), k, off, off + n, L.recv_idx.data(), L.recv_val.data(), ws_);
      if (!r.ok()) {
        if (mark.status == 0) {
          if (r.fault == sparse_message::fault_code::status) {
            mark = r.header;  // forward the upstream report unchanged
          } else {
            mark = {0, static_cast<std::uint32_t>(r.fault), static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(s.peer),
                    static_cast<std::uint32_t>(j)};
            own = r;
            own_peer = s.peer;
          }
        }
        continue;
      }
      if (mark.status != 0) continue;
      std::size_t nrec = 0;
      const std::size_t base = j * 2 * kcap_;
      cur = kern.merge_topk(L.recv_idx.data(), L.recv_val.data(), r.count, L.cur_idx.data(), L.cur_val.data(), cur, k, L.tmp_idx.data(),
                            L.tmp_val.data(), L.rec_idx.data() + base, L.rec_val.data() + base, &nrec,
                            kernels::merge_scratch<I>{L.u_idx.data(), L.u_sum.data(), L.u_key.data()}, ws_);
      L.rec_count[j] = nrec;
      std::swap(L.cur_idx, L.tmp_idx);
      std::swap(L.cur_val, L.tmp_val);
    } else if (s.role == plan::tree_role::send) {
      kern.pack(send_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), mark.status ? 0 : cur, mark);
      t.send(send_msg_.data(), mb, s.peer);
      wire_bytes_ += mb;
    }
  }
  if (rank == 0) kern.pack(bcast_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), mark.status ? 0 : cur, mark);
  else kern.pack(bcast_msg_.data(), k, L.cur_idx.data(), L.cur_val.data(), 0);  // overwritten by the broadcast
  t.broadcast(bcast_msg_.data(), mb, 0);
  sc.lap(trace_kind::collective, 0, *cx_->iteration, mb);
  wire_bytes_ += mb;
  // The global list, into tmp (cur is no longer needed).
  const auto F = kern.unpack_checked(bcast_msg_.data(), k, off, off + n, L.tmp_idx.data(), L.tmp_val.data(), ws_);
  if (!F.ok() || mark.status != 0) {  // a rank rejected a message: every rank learns it from the broadcast
    restore_own<I>(cnt);
    fail_global(F, mark, own, own_peer, k, off, n);
  }
  const std::size_t nf = F.count;
  const I* fi = L.tmp_idx.data();
  float* g = cx_->grads;
  kern.fill_zero(g + off, n);
  const float post = (!Ctx::narrow && cx_->average) ? cx_->mean_scale() : 1.0f;
  kern.decode_scatter_counted(g, fi, L.tmp_val.data(), nf, post, decoded_.data());
  // Residuals: Algorithm 4 line 10, then the merge records of indices in the global list.
  kern.restore_unselected(residual_.data(), L.mine_idx.data(), L.mine_val.data(), cnt, fi, nf, unscale_);
  for (std::size_t j = 0; j < steps_.size(); ++j) {
    const std::size_t base = j * 2 * kcap_;
    kern.restore_records_in(residual_.data(), L.rec_idx.data() + base, L.rec_val.data() + base, L.rec_count[j], fi, nf, unscale_);
  }
  if constexpr (on_host) {
    for (std::size_t j = 0; j < nf; ++j) exchanged_[exchanged_n_ + j] = static_cast<std::uint64_t>(fi[j]);
    exchanged_n_ += nf;
  }
}

// Throws the error of a failed gTop-k exchange: a rejected message reported through the tree
// (this rank's own mark, or the mark the broadcast carried), else the broadcast itself.
template <class Ctx, double Density, bool Global>
void topk_engine<Ctx, Density, Global>::fail_global(const sparse_message::unpack_result& F, const sparse_message::header& mark, const sparse_message::unpack_result& own,
                              int own_peer, std::size_t k, std::size_t off, std::size_t n) const {
  const sparse_message::header* h = mark.status != 0 ? &mark : (F.fault == sparse_message::fault_code::status ? &F.header : nullptr);
  if (h != nullptr) {
    const auto fault = static_cast<sparse_message::fault_code>(h->status);
    std::string what = fmt::format("Sparsifier<GTopK>: in merge round {}, rank {}"
                       " rejected the message from rank {} (its {})", h->round, h->reporter, h->source, sparse_message::parameter_of(fault));
    if (own_peer >= 0) what += ": " + sparse_message::describe(own, k, off, off + n);
    else what += "; every rank stops this exchange.";
    throw parse_error(sparse_message::parameter_of(fault), what, fix_text());
  }
  throw parse_error(sparse_message::parameter_of(F.fault),
                    "Sparsifier<GTopK>: the global top-k broadcast from rank 0 was rejected: " + sparse_message::describe(F, k, off, off + n), fix_text());
}

}  // namespace gflow::detail
