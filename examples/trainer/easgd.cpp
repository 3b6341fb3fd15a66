// Sync elastic averaging (You et al., equations 1-2; with --momentum > 0 equations 5-6): the
// ranks exchange weights, not gradients, through gflow::elastic_averager; the center weight is
// what is evaluated. No gradient exchanger, so this experiment needs no policy list.
#include <chrono>
#include <vector>

#include <gflow/elastic.hpp>

#include "trainer.hpp"

namespace trainer {

int main_easgd(int argc, char** argv, const char* name) {
  return run_main(argc, argv, name, [](session& s) {
    const options& o = s.opts();
    const float P = static_cast<float>(s.comm().size());
    const float rho = o.rho > 0 ? o.rho : 0.9f / (o.lr * P);  // lr * rho * P = 0.9 (Zhang et al.)
    gflow::elastic_averager<gflow::mpi::transport> ea(s.comm(), s.params(), rho, o.momentum);
    std::vector<float> grads(s.params().size());
    const grad_sink sink{[&](std::size_t i) { return std::span<float>(grads.data() + s.offsets()[i], s.layout()[i].numel); },
                         [](std::size_t) {}};
    for (int epoch = 0; epoch < o.epochs; ++epoch) {
      epoch_stats st;
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t it = 0; it < s.iterations_per_epoch(); ++it) {
        st.loss_sum += s.train_batch(epoch, it, s.params(), sink, 1.0f);
        s.prepare_gradients(grads, 1.0f);  // weight decay / LARS, as in the gradient experiments
        ea.step(s.params(), grads, o.lr);
        st.wire_bytes += static_cast<double>(ea.wire_bytes());
        st.collectives += 1;
      }
      st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.iterations = s.iterations_per_epoch();
      s.end_epoch(epoch, ea.center(), st);
    }
  });
}

}  // namespace trainer
