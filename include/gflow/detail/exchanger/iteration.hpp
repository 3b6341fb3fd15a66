#pragma once
// The host-side bookkeeping of one exchanger's iterations (basic_exchanger derives from it):
// which tensors are ready and how, how far the ready prefix of the pool reaches, which buckets
// have launched, and the state of the training-loop features (docs/DESIGN.md, "Training loops"):
// gradient accumulation (no_sync), unused tensors (find_unused), uneven inputs (join) and the
// learned generation order (learn_order). Nothing here touches memory of the transport's space
// or issues a collective; the exchanger does both.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../layout.hpp"
#include "../support/checkpoint.hpp"
#include "usage.hpp"

namespace gflow::detail {

/// The scope of ex.no_sync() (gradient accumulation): while one lives, ready() exchanges nothing.
/// Move-only; scopes nest.
class no_sync_scope {
 public:
  explicit no_sync_scope(int& depth) noexcept : depth_(&depth) { ++depth; }
  no_sync_scope(no_sync_scope&& o) noexcept : depth_(std::exchange(o.depth_, nullptr)) {}
  no_sync_scope(const no_sync_scope&) = delete;
  no_sync_scope& operator=(const no_sync_scope&) = delete;
  no_sync_scope& operator=(no_sync_scope&&) = delete;
  ~no_sync_scope() {
    if (depth_) --*depth_;
  }

 private:
  int* depth_;
};

class iteration_state {
 protected:
  iteration_state(std::size_t tensors, int ranks, bool learn_order)
      : ready_(tensors, 0), held_(tensors, 0), contributors_(ranks), ranks_(ranks), learn_option_(learn_order), learning_(learn_order) {}

  // How a tensor became ready: the trainer's ready(i), or filled by the exchanger (find_unused's
  // zeros, a held accumulation, join()'s shadow iteration).
  enum : std::uint8_t { by_trainer = 1, filled = 2 };

  void check_index(const Layout& l, std::size_t i, const char* where) const {
    if (i >= l.size()) throw index_error(l, i, where);
  }
  void between_iterations(const Layout& l, const char* what) const {
    if (ready_count_ != 0) throw mid_iteration_error(what, ready_count_, l.size(), iteration_);
  }
  void outside_accumulation(const char* what) const {
    if (no_sync_depth_ > 0 || accumulated_) throw accumulating_error(what, no_sync_depth_);
  }

  /// finish() with tensors not marked: those holding an accumulation count as ready; the others
  /// are find_unused's zeros, or (without it) the first of them is the usage error.
  void check_missing(const Layout& l, bool find_unused) const {
    std::size_t unheld = 0, first = l.size();
    for (std::size_t i = 0; i < l.size(); ++i)
      if (!ready_[i] && !held_[i] && unheld++ == 0) first = i;
    if (unheld && !find_unused) throw missing_error(l, l.size() - ready_count_, first, iteration_);
  }

  /// uneven_inputs: what this rank puts into the iteration's all_gather of flags, then the count.
  [[nodiscard]] std::uint64_t training_flag() const noexcept { return joined_ ? 0 : 1; }
  void count_contributors() {
    int first = -1;
    contributors_ = 0;
    for (std::size_t r = 0; r < flags_.size(); ++r)
      if (flags_[r] && contributors_++ == 0) first = static_cast<int>(r);
    if (first >= 0) last_rank_ = first;
  }

  /// find_unused: this rank's bits (words of 64 tensors) in bits_[0, words); after the exchange
  /// of bits_[words, words * (P + 1)), unused_from_bits() lists the tensors no rank marked.
  std::size_t used_bits(std::size_t P) {
    const std::size_t n = ready_.size(), words = (n + 63) / 64;
    bits_.assign(words * (P + 1), 0);
    for (std::size_t i = 0; i < n; ++i)
      if (ready_[i] == by_trainer || held_[i]) bits_[i / 64] |= std::uint64_t{1} << (i % 64);
    return words;
  }
  void unused_from_bits(std::size_t P) {
    const std::size_t n = ready_.size(), words = (n + 63) / 64;
    unused_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      bool used = false;
      for (std::size_t r = 0; r < P && !used; ++r) used = (bits_[words * (r + 1) + i / 64] >> (i % 64)) & 1u;
      if (!used) unused_.push_back(i);
    }
  }

  /// Checkpoints: the learn_order state (0 off, 1 to learn, 2 learned, then the pool's order).
  void write_order(checkpoint_writer& w, const std::vector<std::size_t>& pool_order) const {
    w.u64(!learn_option_ ? 0 : learning_ ? 1 : 2);
    if (learn_option_ && !learning_)
      for (std::size_t i : pool_order) w.u64(i);
  }
  /// Reads what write_order wrote (order empty: the default order); validates, changes nothing.
  struct saved_order {
    std::uint64_t state = 0;
    std::vector<std::size_t> order;
  };
  saved_order read_order(checkpoint_reader& r) const {
    saved_order s;
    s.state = r.u64("learn_order");
    if (s.state > 2) r.fail("learn_order", fmt::format("the learn_order state is {}; 0, 1 or 2 were written.", s.state));
    if (s.state != 2) return s;
    std::vector<bool> seen(ready_.size(), false);
    for (std::size_t pos = 0; pos < ready_.size(); ++pos) {
      const std::uint64_t i = r.u64("the learned order");
      if (i >= ready_.size() || seen[i]) r.fail("learn_order", fmt::format("the learned order names tensor {} twice or past the layout.", i));
      seen[i] = true;
      s.order.push_back(static_cast<std::size_t>(i));
    }
    return s;
  }
  /// After the checksum: a checkpoint of a run with the other learn_order is a mismatch.
  void check_order_option(const saved_order& s) const {
    if ((s.state != 0) != learn_option_)
      throw mismatch_error("learn_order", std::string("the checkpoint was saved by an exchanger with learn_order ") + (s.state ? "on" : "off") +
                                              "; this one has it " + (learn_option_ ? "on" : "off") + ".",
                           "construct the exchanger with the exchange_options::learn_order of the run that saved the checkpoint.");
  }

  /// After finish() (or its error): the next iteration starts with nothing ready.
  void next_iteration() {
    std::fill(ready_.begin(), ready_.end(), std::uint8_t{0});
    if (accumulated_) std::fill(held_.begin(), held_.end(), std::uint8_t{0});
    accumulated_ = false;
    begun_ = false;
    contributors_ = ranks_;
    ready_count_ = 0;
    prefix_pos_ = 0;
    next_bucket_ = 0;
    ++iteration_;
  }

  std::vector<std::uint8_t> ready_;  // 0, by_trainer or filled
  std::vector<std::uint8_t> held_;   // no_sync: the view holds accumulated gradient
  std::size_t ready_count_ = 0;
  std::size_t prefix_pos_ = 0;
  std::size_t next_bucket_ = 0;
  std::uint64_t iteration_ = 0;
  int no_sync_depth_ = 0;
  bool accumulated_ = false;  // some held_ is set
  int contributors_;          // ranks in this iteration's average (uneven_inputs)
  int ranks_;
  bool begun_ = false;   // uneven_inputs: this iteration's count is taken
  bool joined_ = false;  // inside join()
  int last_rank_ = 0;
  std::vector<std::uint64_t> flags_, bits_;
  std::vector<std::size_t> unused_;
  bool learn_option_;
  bool learning_;                   // learn_order, before the first finish()
  std::vector<std::size_t> order_;  // the ready() order seen while learning
  std::uint64_t generation_ = 0;
};

}  // namespace gflow::detail
