#pragma once
// The device half of gflow.torch's library (libgflow_capi_cuda.so): port_for over a device
// transport (gflow::mpi_device::transport, gflow::nccl::transport), with the caller's CUDA stream
// ordered around the exchange, and the registrar of the device menu (menu_device_*.cu).
//
// Stream order (what torch's stream and the transport's stream see):
//   - use_stream(s) before ready(i): the exchanger's producer stream is s
//     (Exchanger::set_producer_stream), so each bucket's work waits, by an event, for everything
//     enqueued on s when its last ready() came: backward's writes of the gradients.
//   - finish(): returns with the pool complete (the device exchanger synchronises its stream to
//     count non-finite values), and s then waits for the transport's stream as well, so nothing
//     torch enqueues later on s can run before the exchange.
//   - gather_shards(values): the transport's stream waits for s (the optimizer's step wrote the
//     shard there), and s waits for the gather.
//   - join(step): s waits for each shadowed iteration's exchange before the step runs.
//   - finish() and join() first make the transport's stream wait for s: their pool writes that
//     come before any bucket's launch (find_unused's and the shadow iterations' zero fills) must
//     not overtake what s still reads of the pool (the previous step's .grad); so does each
//     shadow iteration after the step.
// The factory builds the exchanger with the transport's device current, so that its pool and
// buffers are allocated there.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include <gflow/cuda/exchanger.cuh>
#include <gflow/cuda/mpi_transport.cuh>
#include <gflow/transport/nccl.hpp>  // the CUDA library is built only where NCCL is (python/CMakeLists.txt)

#include "port.hpp"

namespace gflow::python {

template <class Exchange, class Transport>
class device_port_for final : public port_for<Exchange, Transport> {
  using base = port_for<Exchange, Transport>;
  using base::ex_;

 public:
  device_port_for(Transport& t, Layout layout, exchange_options o) : base(t, std::move(layout), o), t_(&t) {
    gflow::detail::cuda::device_guard g(t.device());  // the factory made it current for base's allocations too
    cudaEvent_t e = nullptr;
    gflow::detail::cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags for gflow.torch's exchange event");
    done_.reset(e);
  }

  int device() const override { return t_->device(); }

  void use_stream(void* stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    if (s == user_ && has_user_) return;
    user_ = s;
    has_user_ = true;
    ex_.set_producer_stream(s);
  }

  exchange_status finish() override {
    exchange_waits();
    exchange_status st = base::finish();
    user_waits();
    return st;
  }

  void gather_shards(float* values, std::size_t n) override {
    exchange_waits();
    base::gather_shards(values, n);
    user_waits();
  }

  join_status join(const std::function<void(const exchange_status&)>& after_each) override {
    exchange_waits();
    if (!after_each) return base::join(after_each);
    return base::join([this, &after_each](const exchange_status& st) {
      user_waits();
      after_each(st);
      exchange_waits();  // the next shadow iteration zero-fills the pool the step may still read
    });
  }

 private:
  // The caller's stream waits for everything enqueued on the transport's stream so far.
  void user_waits() {
    if (!has_user_ || user_ == t_->stream()) return;
    gflow::detail::cuda::device_guard g(t_->device());
    gflow::detail::cuda::check_cuda(cudaEventRecord(done_.get(), t_->stream()), "cudaEventRecord on the exchange stream");
    gflow::detail::cuda::check_cuda(cudaStreamWaitEvent(user_, done_.get(), 0), "cudaStreamWaitEvent of the caller's stream");
  }
  // The transport's stream waits for everything enqueued on the caller's stream so far.
  void exchange_waits() {
    if (!has_user_ || user_ == t_->stream()) return;
    gflow::detail::cuda::device_guard g(t_->device());
    gflow::detail::cuda::check_cuda(cudaEventRecord(done_.get(), user_), "cudaEventRecord on the caller's stream");
    gflow::detail::cuda::check_cuda(cudaStreamWaitEvent(t_->stream(), done_.get(), 0), "cudaStreamWaitEvent of the exchange stream");
  }
  struct event_destroy {
    void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
  };

  Transport* t_;
  cudaStream_t user_ = nullptr;
  bool has_user_ = false;
  std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroy> done_;
};

/// A device port over *t, built with t's device current (the pool is allocated on the current device).
template <class Exchange, class Transport>
std::unique_ptr<port> make_device_port(void* t, Layout layout, exchange_options o) {
  Transport& tr = *static_cast<Transport*>(t);
  gflow::detail::cuda::device_guard g(tr.device());
  return std::make_unique<device_port_for<Exchange, Transport>>(tr, std::move(layout), o);
}

/// Registers Exchange for device memory over MPI and over NCCL, under its derived name and `alias`.
template <class Exchange>
struct device_registrar {
  explicit device_registrar(const char* policies, const char* alias = nullptr) {
    register_names<Exchange>(policies, alias, space::device_mpi, &make_device_port<Exchange, mpi_device::transport>);
    register_names<Exchange>(policies, alias, space::device_nccl, &make_device_port<Exchange, nccl::transport>);
  }
};

}  // namespace gflow::python

/// GFLOW_PYTHON_DEVICE_COMPOSITION(id, policies...): one device menu entry (a .cu translation unit).
#define GFLOW_PYTHON_DEVICE_COMPOSITION(id, ...) \
  static const ::gflow::python::device_registrar<::gflow::Exchanger<__VA_ARGS__>> gflow_python_device_entry_##id(#__VA_ARGS__)
