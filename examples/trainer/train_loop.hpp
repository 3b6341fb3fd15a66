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
#include <gflow/timeline.hpp>
#include <gflow/optim/loss_scale.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/plan/density.hpp>
#include <gflow/policies/csc.hpp>
#include <gflow/policies/topk.hpp>
#include <gflow/transport/mpi.hpp>

#include "trainer.hpp"

namespace trainer {

template <class Exchange>
void train(session& s) {
  using exchanger_t = typename Exchange::template on<gflow::mpi::transport>;
  using sparsifier_t = std::remove_cvref_t<decltype(std::declval<exchanger_t&>().sparsifier())>;
  constexpr bool is_csc = requires(sparsifier_t& e) { e.selected_chunks(); e.set_warmup(1, 1); };
  constexpr bool is_topk = requires(sparsifier_t& e) { e.set_schedule(gflow::plan::density_schedule::constant(1.0)); };
  constexpr bool wide_wire = std::is_same_v<typename exchanger_t::wire_type, float>;
  const options& o = s.opts();

  exchanger_t ex(s.comm(), s.layout());
  // The model's parameters are laid out like the pool, so the optimizer's step is one pass.
  for (std::size_t i = 0; i < s.layout().size(); ++i)
    if (ex.pool_plan().offset[i] != s.offsets()[i])
      throw gflow::usage_error("pool", "the exchanger's pool order differs from the model's parameter layout.",
                               "build the model's parameter buffer with gflow::plan::plan_pool(layout).");

  const std::uint64_t warmup = o.warmup_iters >= 0 ? static_cast<std::uint64_t>(o.warmup_iters) : s.iterations_per_epoch() / 2;
  if constexpr (is_csc) {
    ex.sparsifier().set_momentum(o.momentum);  // Algorithm 1's momentum correction
    ex.sparsifier().set_warmup(warmup, warmup);  // dense, then a linear ramp as long again
  }
  if constexpr (is_topk) {
    // Paper 003's warm-up densities compressed into `warmup` iterations, then the final density.
    const double final_d = ex.sparsifier().density();
    if (warmup >= 3) {
      std::vector<gflow::plan::density_step> steps;
      for (double d : {0.25, 0.0725, 0.015})
        if (d > final_d) steps.push_back({(steps.size() + 1) * (warmup / 3), d});
      ex.sparsifier().set_schedule(gflow::plan::density_schedule::per_iteration(steps, final_d));
    }
  }

  // Residual-keeping sparsifiers hold gradients across iterations in the units they were fed:
  // a scale that changes would mix units, so they accept only a constant scale.
  constexpr bool keeps_residual = is_csc || is_topk;
  gflow::optim::loss_scale_options lso;
  lso.initial = 1.0f;
  lso.dynamic = false;
  switch (o.loss_scale) {
    case loss_scale_mode::automatic:
      if (!wide_wire && !keeps_residual) {
        lso.initial = o.loss_scale_value;
        lso.dynamic = true;
      }
      break;
    case loss_scale_mode::none: break;
    case loss_scale_mode::fixed: lso.initial = o.loss_scale_value; break;
    case loss_scale_mode::dynamic:
      if (keeps_residual)
        throw gflow::invalid_argument("--loss-scale", "dynamic loss scaling with a sparsifier that keeps residuals (CSC, TopK, GTopK) "
                                                      "would add gradients of different scales.",
                                      "pass --loss-scale S (a constant scale, e.g. 1024) or --loss-scale none.");
      lso.initial = o.loss_scale_value;
      lso.dynamic = true;
      break;
  }
  lso.growth_interval = o.loss_scale_window;
  lso.max_scale = std::max(lso.max_scale, lso.initial);
  lso.min_scale = std::min(lso.min_scale, lso.initial);
  gflow::optim::dynamic_loss_scale scaler(lso);
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
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    epoch_stats st;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t it = 0; it < s.iterations_per_epoch(); ++it) {
      st.loss_sum += s.train_batch(epoch, it, w, sink, scaler.scale());
      const gflow::exchange_status status = ex.finish();  // averaged gradients in the pool
      st.wire_bytes += static_cast<double>(status.wire_bytes);
      st.collectives += static_cast<double>(status.collectives);
      const float inv = scaler.inverse();  // the scale these gradients were made with
      if (!scaler.update(status.finite())) {
        ++st.skipped;  // every rank saw the same status: every rank skips
        continue;
      }
      s.prepare_gradients(g, inv);
      if constexpr (is_csc) opt.step(w, g, ex.sparsifier().selected_chunks(), ex.sparsifier().chunk_elems());
      else opt.step_all(w, g);
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.iterations = s.iterations_per_epoch();
    s.end_epoch(epoch, w, st);
  }
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
