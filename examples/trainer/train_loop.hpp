#pragma once
// The part of the trainer that depends on the policy composition: the training loop over one
// gflow::Exchanger type. Each experiment binary (cmake/gflow_experiment.cmake) is
//     using Exchange = gflow::Exchanger<...>;
//     int main(int argc, char** argv) { return trainer::main_for<Exchange>(argc, argv, "name"); }
// and everything else (data, model, evaluation) comes from the gflow_trainer library.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/optim/loss_scale.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/transport/mpi.hpp>

#include "exchange_setup.hpp"
#include "restart.hpp"
#include "trainer.hpp"

namespace trainer {

template <class Exchange>
void train(session& s) {
  using exchanger_t = typename Exchange::template on<gflow::mpi::transport>;
  constexpr bool is_csc = composition_traits<exchanger_t>::is_csc;
  const options& o = s.opts();

  exchanger_t ex(s.comm(), s.layout());
  // The model's parameters are laid out like the pool, so the optimizer's step is one pass.
  for (std::size_t i = 0; i < s.layout().size(); ++i)
    if (ex.pool_plan().offset[i] != s.offsets()[i])
      throw gflow::usage_error("pool", "the exchanger's pool order differs from the model's parameter layout.",
                               "build the model's parameter buffer with gflow::plan_pool(layout).");

  configure_sparsifier(ex, o, s.iterations_per_epoch());
  gflow::optim::dynamic_loss_scale scaler(loss_scale_for<exchanger_t>(o));
  gflow::optim::momentum_sgd opt(ex.pool_size(), o.lr, o.momentum);

  std::optional<gflow::timeline> trace;  // --trace FILE
  if (!o.trace.empty()) {
    trace.emplace(std::size_t{1} << 18);
    ex.set_timeline(&*trace);
    trace->start(ex.transport());
  }

  const grad_sink sink{[&](std::size_t i) { return ex.view(i); }, [&](std::size_t i) { ex.ready(i); }};
  std::span<float> w = s.params();
  const std::span<float> g{ex.pool_data(), ex.pool_size()};
  // Replicas start equal (rank 0's parameters, not only the same seed); --verify-replicas N
  // checks every N steps that they stay so (gflow::mismatch_error on every rank otherwise).
  gflow::broadcast_parameters(s.comm(), w, 0);
  const gflow::Layout w_layout = pool_order_layout(s.layout(), s.offsets());
  // --resume DIR: the newest complete checkpoint set, re-sharded when the job size differs.
  const std::uint64_t start = o.resume.empty() ? 0 : resume_training(ex, o, w, opt, scaler);
  const std::size_t ipe = s.iterations_per_epoch();
  for (int epoch = static_cast<int>(start / ipe); epoch < o.epochs; ++epoch) {
    epoch_stats st;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t it = epoch == static_cast<int>(start / ipe) ? start % ipe : 0; it < ipe; ++it) {
      const std::uint64_t done = static_cast<std::uint64_t>(epoch) * ipe + it;  // steps so far
      fault_point(o, s.comm().rank(), done);  // the restart tests: this rank is lost
      // A lost rank: every survivor's next collective (the checkpoint's barrier or the exchange) times out.
      const gflow::exchange_status status = report_timeouts(o, s.comm().rank(), done, [&] {
        if (o.checkpoint_every > 0 && done > start && done % o.checkpoint_every == 0) save_training_checkpoint(ex, o, w, opt, scaler);
        if (o.verify_replicas > 0 && done > 0 && done % o.verify_replicas == 0) gflow::verify_replicas(s.comm(), w, w_layout);
        st.loss_sum += s.train_batch(epoch, it, w, sink, scaler.scale());
        return ex.finish();  // averaged gradients in the pool
      });
      const float inv = account_step(st, status, scaler);
      if (inv == 0.0f) continue;  // non-finite: skipped on every rank
      s.prepare_gradients(g, inv);
      if constexpr (is_csc) opt.step(w, g, ex.sparsifier().selected_chunks(), ex.sparsifier().chunk_elems());
      else opt.step_all(w, g);
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.iterations = ipe;
    s.end_epoch(epoch, w, st);
  }
  save_params(o, s.comm().rank(), w);  // --save-params: the restart tests' bitwise comparison
  if (trace) {
    ex.set_timeline(nullptr);
    trace->write_chrome_trace(ex.transport(), o.trace);
    if (ex.transport().rank() == 0 && trace->dropped() > 0)
      std::fprintf(stderr, "trace: the first %zu events per rank are in %s (%zu later ones did not fit)\n", trace->size(), o.trace.c_str(), trace->dropped());
  }
}

template <class Exchange>
int main_for(int argc, char** argv, const char* name) {
  return run_main(argc, argv, name, [](session& s) { train<Exchange>(s); });
}

}  // namespace trainer
