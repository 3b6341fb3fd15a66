#pragma once
// gflow::nccl, part 3 of 3: the watchdog of a communicator, the base of gflow::nccl::transport.
// It holds the communicator and what names its rank in errors, checks every NCCL call, and bounds
// every host wait: poll() spins on a CUDA query while asking ncclCommGetAsyncError, aborts the
// communicator (ncclCommAbort) on an asynchronous error or once the timeout passes, and raises
// transport_error / timeout_error. After an abort live() refuses every operation.
// (transport/nccl.hpp includes all the parts; include that one.)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "../../detail/cuda/check.cuh"
#include "../../error.hpp"
#include "../timeout.hpp"
#include "../transport.hpp"
#include "check.hpp"

namespace gflow::nccl::detail {

class comm_watch {
 public:
  // ---- timeouts ----------------------------------------------------------------------------
  /// Bounds every later host wait of this transport (0: wait forever). Sub-groups made by
  /// split() afterwards inherit it.
  void set_timeout(std::chrono::milliseconds t) {
    gflow::detail::check_timeout(t);
    timeout_ = t;
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// True once a timeout or an asynchronous error made this transport abort its communicator.
  [[nodiscard]] bool aborted() const noexcept { return !aborted_.empty(); }

 protected:
  comm_watch() = default;
  comm_watch(ncclComm_t comm, bool owns_comm) noexcept : comm_(comm), owns_comm_(owns_comm) {}
  comm_watch(const comm_watch&) = delete;
  comm_watch& operator=(const comm_watch&) = delete;
  ~comm_watch() = default;

  void swap_watch(comm_watch& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(owns_comm_, o.owns_comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(timeout_, o.timeout_);
    std::swap(aborted_, o.aborted_);
  }

  [[nodiscard]] std::string who() const {
    return fmt::format("rank {} of {} (CUDA device {})", rank_, size_, device_);
  }

  void check(ncclResult_t r, const char* op) const {
    if (r != ncclSuccess) fail(r, op, who(), comm_);
  }

  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size_, what); }

  void live(const char* op) const {
    if (!aborted_.empty())
      throw transport_error(op, who() + ": the communicator was aborted after " + aborted_ + ".",
                            "destroy this transport (and whatever uses it) and create the communicators again (restart the job or its failed ranks).");
  }

  // ncclCommAbort: frees the communicator and makes its kernels still on the stream exit, so the
  // stream can drain. The handle is gone afterwards (also for a borrowed communicator).
  void abort_comm(std::string why) noexcept {
    if (comm_ != nullptr) {
      int prev = -1;
      const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
      (void)ncclCommAbort(comm_);
      if (switched) (void)cudaSetDevice(prev);
    }
    comm_ = nullptr;
    aborted_ = std::move(why);
  }

  void check_async(const char* op) {
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::string msg = std::string(op) + " failed on " + who() + " (asynchronous error): " + ncclGetErrorString(async) + ".";
    if (const char* last = ncclGetLastError(comm_); last != nullptr && *last != '\0') msg += std::string(" NCCL: ") + last;
    abort_comm(std::string("an asynchronous error in ") + op);
    throw transport_error(op, msg + " The communicator was aborted (ncclCommAbort).", fix_for(async));
  }

  // Polls until query() says the work is done; with a timeout, aborts and throws once it passes.
  // `last_issued` is the number of the last operation issued on this transport (for the message).
  template <class Query>
  void poll(Query query, const char* op, std::uint64_t last_issued) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (unsigned spins = 0;; ++spins) {
      const cudaError_t e = query();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) gflow::detail::cuda::check_cuda(e, std::string(op) + " on " + who());
      (void)cudaGetLastError();  // cudaErrorNotReady is an answer, not an error: keep it out of later checks
      check_async(op);
      if (spins < 64) continue;
      std::this_thread::yield();
      if (timeout_.count() > 0 && clock::now() - start >= timeout_) time_out(op, last_issued);
    }
  }

  [[noreturn]] void time_out(const char* op, std::uint64_t last_issued) {
    const std::string what = fmt::format("{} waited {} ms for {} (operation #"
                             "{} of this transport is the last one issued) to complete on its stream. NCCL cannot report which ranks did not arrive: a rank that never issued its part, exited, or is stuck in earlier work keeps every other rank waiting. The communicator was aborted (ncclCommAbort).", who(), timeout_.count(), op, last_issued);
    abort_comm(std::string("a timeout in ") + op);
    throw timeout_error(op, what,
                        "find the rank that reported no timeout or died (an MPI transport alongside names it); if the ranks are only "
                        "slow, raise the timeout (set_timeout). Destroy this transport and recreate the communicators.");
  }

  ncclComm_t comm_ = nullptr;
  bool owns_comm_ = false;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::chrono::milliseconds timeout_{0};  // default_timeout until set_timeout()
  std::string aborted_;  // why the communicator was aborted; empty while usable
};

}  // namespace gflow::nccl::detail
