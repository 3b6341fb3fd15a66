#pragma once
// One step of the gradient-accumulation check shared by the host and MPI tests
// (exchanger/test_training_loop.cpp, mpi/test_mpi_training_loop.cpp): exchanger `a` runs M
// micro-batches, all but the last under no_sync(), backward adding grad(i, j, m) into the views;
// exchanger `b` gets the same sums written at once and exchanges them once. The caller compares.
#include <algorithm>
#include <cstddef>

namespace gflow_test {

template <class X, class Grad>
void accumulate_then_exchange(X& a, X& b, int micro_batches, Grad&& grad) {
  const auto& l = a.layout();
  auto add_micro_batch = [&](int m) {
    for (std::size_t i = l.size(); i-- > 0;) {
      auto v = a.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] += grad(i, j, m);
      a.ready(i);
    }
  };
  for (std::size_t i = 0; i < l.size(); ++i) std::fill(a.view(i).begin(), a.view(i).end(), 0.0f);
  {
    auto scope = a.no_sync();
    for (int m = 0; m + 1 < micro_batches; ++m) add_micro_batch(m);
  }
  add_micro_batch(micro_batches - 1);
  (void)a.finish();
  for (std::size_t i = l.size(); i-- > 0;) {
    auto v = b.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) {
      float s = 0.0f;
      for (int m = 0; m < micro_batches; ++m) s += grad(i, j, m);
      v[j] = s;
    }
    b.ready(i);
  }
  (void)b.finish();
}

}  // namespace gflow_test
