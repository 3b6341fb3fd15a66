#pragma once
// Topology<Algo>: how a dense allreduce travels. Every dense allreduce the exchanger issues
// goes through the topology's engine, built once per exchanger over its transport:
//
//   typename Algo::template engine<T> e(transport);
//   e.run(buf, n);              // sum buf over all ranks, in place, complete on return
//   auto r = e.start(buf, n);   // or begin it (non-blocking form) ...
//   e.wait(r);                  // ... and complete it later
//
// Ring: the transport's own allreduce (MPI_Allreduce / ncclAllReduce / in-process).
#include <concepts>
#include <cstddef>

#include "../transport/transport.hpp"
#include "family.hpp"

namespace gflow {

struct Ring {
  template <transport T>
  class engine {
   public:
    using request = typename T::request;
    explicit engine(T& t) : t_(&t) {}
    template <class W>
    void run(W* buf, std::size_t n) { t_->all_reduce(buf, n, reduce_op::sum); }
    template <class W>
    request start(W* buf, std::size_t n) { return t_->iall_reduce(buf, n, reduce_op::sum); }
    void wait(request& r) { t_->wait(r); }
   private:
    T* t_;
  };
};

template <class Algo = Ring>
struct Topology {
  using gflow_family = topology_family;
  using algorithm = Algo;
};

template <class P>
concept topology_policy = std::same_as<typename P::gflow_family, topology_family> && requires { typename P::algorithm; };

static_assert(topology_policy<Topology<>>);

}  // namespace gflow
