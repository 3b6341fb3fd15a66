#pragma once
// The libtorch CNN trainer's composition-dependent half, free of <torch/torch.h>: each
// experiment binary (gflow_add_experiment(... MODE torch)) is
//     using Exchange = gflow::Exchanger<...>;
//     int main(int argc, char** argv) { return trainer::torch_cnn::main_for<Exchange>(argc, argv, "name"); }
// It wraps its exchanger in an exchange_port (a small virtual interface) and hands it to
// run(), which lives in the static library gflow_torch_trainer, the only code that includes
// libtorch: the model, autograd hooks, optimizers, data and evaluation are compiled once.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <type_traits>

#include <gflow/exchanger.hpp>
#include <gflow/optim/loss_scale.hpp>
#include <gflow/transport/mpi.hpp>

#include "exchange_setup.hpp"
#include "restart.hpp"
#include "trainer.hpp"

namespace trainer::torch_cnn {

/// The torch trainer's own flags (taken out of argv before the shared parser sees it).
struct loop_options {
  std::size_t probe = 0;       // --probe N: timing probe iterations
  std::size_t accumulate = 1;  // --accumulate N: micro-batches per optimizer step (no_sync)
  bool unused_branch = false;  // --unused-branch: a residual block some iterations skip (find_unused)
  bool uneven = false;         // --uneven: rank r gets fewer batches; join() at the end of each epoch
  bool learn_order = true;     // --no-learn-order turns exchange_options::learn_order off
  bool shard = false;          // --shard: the composition with Sharding<ReduceScatter> (ZeRO-2; learn_order off)
  /// The exchanger options these flags ask for.
  [[nodiscard]] gflow::exchange_options exchange() const {
    gflow::exchange_options x;
    x.find_unused = unused_branch;
    x.uneven_inputs = uneven;
    x.learn_order = learn_order && !shard;  // a learned order would move the shards (not built with Sharding yet)
    return x;
  }
};

/// One exchanger, type-erased: what the libtorch side needs of it.
class exchange_port {
 public:
  virtual ~exchange_port() = default;
  virtual std::span<float> view(std::size_t i) = 0;  // tensor i's slot in the pool (layout index)
  virtual void ready(std::size_t i) = 0;             // from tensor i's gradient-accumulator hook
  virtual gflow::exchange_status finish() = 0;
  virtual std::span<float> pool() = 0;
  virtual std::span<const std::size_t> offsets() const = 0;  // pool offset per tensor
  virtual gflow::optim::loss_scale_options loss_scale() const = 0;
  /// CSC only: the chunks exchanged this iteration (ascending) and the chunk size; the step
  /// must then update those chunks only (Algorithm 1). Empty / 0 for every other composition.
  virtual std::span<const std::uint32_t> selected_chunks() const { return {}; }
  virtual std::size_t chunk_elems() const { return 0; }
  // Training loops: gradient accumulation (a no_sync scope from begin to end), join() for
  // uneven inputs, and the pool's generation (it changes when learn_order moves the views).
  virtual void begin_no_sync() = 0;
  virtual void end_no_sync() = 0;
  virtual gflow::join_status join() = 0;
  virtual std::uint64_t generation() const = 0;
  // Checkpoints (issue 25): this rank's exchanger file of the set (gflow::save_checkpoint); the
  // newest complete set loaded (trainer::resume_exchange: gflow::load_checkpoint, re-sharded when
  // the size differs, with the RESHARD line of what it conserved); the exchanger's iteration.
  virtual void save_exchange(const std::string& root) const = 0;
  virtual resumed_set load_exchange(const std::string& root) = 0;
  virtual std::uint64_t iteration() const = 0;
  // --shard (Sharding<ReduceScatter>): after finish() the average is right only inside shard();
  // the step updates those elements, then gather_shards() brings every rank's into the weights.
  virtual bool sharded() const { return false; }
  virtual std::span<const gflow::pool_range> shard() const { return {}; }
  virtual void gather_shards(std::span<float>) {}
};

/// Exchanger<Ps...> with Sharding<ReduceScatter> added (--shard), and whether it composes.
template <class Exchange>
struct with_sharding;
template <class... Ps>
struct with_sharding<gflow::Exchanger<Ps...>> {
  using type = gflow::Exchanger<Ps..., gflow::Sharding<gflow::ReduceScatter>>;
};
template <class Exchange>
inline constexpr bool can_shard = gflow::shardable_scheme<typename Exchange::policies::sparsifier::scheme> &&
                                  !Exchange::policies::sharding::sharded &&
                                  std::is_same_v<typename Exchange::policies::topology::algorithm, gflow::Ring> &&
                                  !requires { requires Exchange::policies::fusion::autotuned; };

/// Builds the port for the model's layout, once the session knows it.
using port_factory = std::function<std::unique_ptr<exchange_port>(gflow::mpi::transport&, const gflow::Layout&, const options&,
                                                                   const loop_options&, std::size_t iterations_per_epoch)>;

/// The whole program: MPI, options (the MLP trainer's flags plus --probe N), data, CNN, training.
int run(int argc, char** argv, const char* name, const port_factory& make_port);

template <class Exchange>
class port final : public exchange_port {
 public:
  using exchanger_t = typename Exchange::template on<gflow::mpi::transport>;
  using tr = composition_traits<exchanger_t>;

  port(gflow::mpi::transport& comm, const gflow::Layout& layout, const options& o, const loop_options& lo, std::size_t ipe)
      : ex_(comm, layout, checked(lo).exchange()), lso_(loss_scale_for<exchanger_t>(o)) {
    configure_sparsifier(ex_, o, ipe);
  }
  std::span<float> view(std::size_t i) override { return ex_.view(i); }
  void ready(std::size_t i) override { ex_.ready(i); }
  gflow::exchange_status finish() override { return ex_.finish(); }
  std::span<float> pool() override { return {ex_.pool_data(), ex_.pool_size()}; }
  std::span<const std::size_t> offsets() const override { return ex_.pool_plan().offset; }
  gflow::optim::loss_scale_options loss_scale() const override { return lso_; }
  std::span<const std::uint32_t> selected_chunks() const override {
    if constexpr (tr::is_csc) return ex_.sparsifier().selected_chunks();
    else return {};
  }
  std::size_t chunk_elems() const override {
    if constexpr (tr::is_csc) return ex_.sparsifier().chunk_elems();
    else return 0;
  }
  void begin_no_sync() override { scope_.emplace(ex_.no_sync()); }
  void end_no_sync() override { scope_.reset(); }
  gflow::join_status join() override {
    if constexpr (exchanger_t::policies::sparsifier::dense && !exchanger_t::policies::sharding::sharded) return ex_.join();
    else return {};  // refused by checked() at construction
  }
  std::uint64_t generation() const override { return ex_.generation(); }
  void save_exchange(const std::string& root) const override { (void)gflow::save_checkpoint(ex_, root); }
  resumed_set load_exchange(const std::string& root) override { return resume_exchange(ex_, root); }
  std::uint64_t iteration() const override { return ex_.iteration(); }
  bool sharded() const override { return exchanger_t::policies::sharding::sharded; }
  std::span<const gflow::pool_range> shard() const override {
    if constexpr (exchanger_t::policies::sharding::sharded) return ex_.shard();
    else return {};
  }
  void gather_shards(std::span<float> values) override {
    if constexpr (exchanger_t::policies::sharding::sharded) ex_.gather_shards(values);
  }

 private:
  static const loop_options& checked(const loop_options& lo) {
    if (lo.uneven && !exchanger_t::policies::sparsifier::dense)
      throw gflow::invalid_argument("--uneven", "join() shadows the other ranks with zero contributions, which a sparsifier's residual cannot be.",
                                    "run --uneven with a dense composition (torch_dense, torch_fp16, torch_funneled, ...).");
    if (lo.uneven && exchanger_t::policies::sharding::sharded)
      throw gflow::invalid_argument("--uneven", "join() with --shard is not built yet: a rank out of data still owns a shard that must be stepped.",
                                    "leave --uneven out of runs with --shard.");
    return lo;
  }
  std::optional<gflow::no_sync_scope> scope_;
  exchanger_t ex_;
  gflow::optim::loss_scale_options lso_;
};

template <class Exchange>
int main_for(int argc, char** argv, const char* name) {
  return run(argc, argv, name, [name](gflow::mpi::transport& comm, const gflow::Layout& layout, const options& o, const loop_options& lo, std::size_t ipe) {
    if (lo.shard) {
      if constexpr (can_shard<Exchange>) {
        return std::unique_ptr<exchange_port>(std::make_unique<port<typename with_sharding<Exchange>::type>>(comm, layout, o, lo, ipe));
      } else {
        throw gflow::invalid_argument("--shard", std::string(name) + "'s composition cannot shard: Sharding<ReduceScatter> needs the dense "
                                                 "sparsifier or OkTopK, Topology<Ring> and a fixed fusion threshold.",
                                      "run --shard with a dense composition (torch_dense, torch_fp16, torch_funneled) or torch_oktopk.");
      }
    }
    return std::unique_ptr<exchange_port>(std::make_unique<port<Exchange>>(comm, layout, o, lo, ipe));
  });
}

}  // namespace trainer::torch_cnn
