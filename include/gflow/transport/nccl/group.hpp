#pragma once
// gflow::nccl, part 2 of 3: gflow::nccl::group (ncclGroupStart / ncclGroupEnd as a scope, and the
// per-thread depth the transport asks to refuse blocking calls inside a group) and
// gflow::nccl::ownership. (transport/nccl.hpp includes all the parts; include that one.)
#include "check.hpp"

namespace gflow::nccl {

namespace detail {

inline int& group_depth() noexcept {
  thread_local int depth = 0;
  return depth;
}

}  // namespace detail

/// Who destroys a communicator handed to gflow::nccl::transport.
enum class ownership { borrowed, owned };

/// ncclGroupStart / ncclGroupEnd as a scope. end() reports a failed ncclGroupEnd; the destructor
/// ends a group still open (while unwinding, ignoring errors).
///
///   { gflow::nccl::group g; for (auto& t : ranks) reqs.push_back(t.iall_reduce(buf[t.rank()], n, sum)); g.end(); }
class group {
 public:
  group() {
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) detail::fail(r, "ncclGroupStart", "this thread", nullptr);
    ++detail::group_depth();
  }
  group(const group&) = delete;
  group& operator=(const group&) = delete;
  ~group() {
    if (open_) {
      --detail::group_depth();
      (void)ncclGroupEnd();
    }
  }
  void end() {
    if (!open_) return;
    open_ = false;
    --detail::group_depth();
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess) detail::fail(r, "ncclGroupEnd", "this thread", nullptr);
  }
  /// True while this thread is inside a gflow::nccl::group.
  [[nodiscard]] static bool active() noexcept { return detail::group_depth() > 0; }

 private:
  bool open_ = true;
};

}  // namespace gflow::nccl
