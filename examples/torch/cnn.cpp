// The libtorch half of the CNN trainer (examples/torch/README.md): model, data as tensors,
// autograd hooks that hand each gradient to gflow as it is produced, optimizers, evaluation,
// reports, and the program frame. The only translation unit that includes <torch/torch.h>.
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/optim/momentum_sgd.hpp>

#include "torch_trainer.hpp"

namespace trainer::torch_cnn {
namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0, clock_type::time_point t1) { return std::chrono::duration<double, std::milli>(t1 - t0).count(); }

// Fashion-MNIST's pixel mean and standard deviation (on [0, 1]), as in the MLP trainer.
constexpr float pixel_mean = 0.2860f, pixel_std = 0.3530f;

// Two conv blocks (3x3 conv without bias, batch norm, ReLU, 2x2 max-pool: 28 -> 14 -> 7) and a
// two-layer classifier. Batch norm lets plain momentum SGD pass 90% in 3 epochs (90.3-90.8% over
// seeds 1-3 at 4 ranks); 16 and 32 channels keep a 3-seed study of six compositions within an
// hour on 2 cores; the 128-wide hidden layer holds 97% of the weights (~0.8 MB of gradients per
// iteration), so the exchange is not negligible next to backward.
//
// --unused-branch adds a residual block after fc1 (x + relu(branch(x))) that some iterations skip
// (exchange_options::find_unused): its parameters then get no gradient on some ranks, or on all.
struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)};
  torch::nn::BatchNorm2d bn1{16};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)};
  torch::nn::BatchNorm2d bn2{32};
  torch::nn::Linear fc1{32 * 7 * 7, 128};
  torch::nn::Linear fc2{128, 10};
  torch::nn::Linear branch{nullptr};
  explicit NetImpl(bool with_branch = false) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    if (with_branch) branch = register_module("branch", torch::nn::Linear(128, 128));
  }
  torch::Tensor forward(torch::Tensor x, bool use_branch = true) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    x = torch::relu(fc1(x.flatten(1)));
    if (branch && use_branch) x = x + torch::relu(branch(x));
    return fc2(x);
  }
};
TORCH_MODULE(Net);

// Normalised images [n, 1, 28, 28] of the listed samples.
torch::Tensor images(const idx_images& im, const std::uint32_t* idx, std::size_t n) {
  const std::size_t px = im.rows * im.cols;
  torch::Tensor x = torch::empty({static_cast<std::int64_t>(n), 1, static_cast<std::int64_t>(im.rows), static_cast<std::int64_t>(im.cols)});
  float* out = x.data_ptr<float>();
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint8_t* p = im.pixels.data() + std::size_t{idx[j]} * px;
    for (std::size_t k = 0; k < px; ++k) out[j * px + k] = (static_cast<float>(p[k]) * (1.0f / 255.0f) - pixel_mean) / pixel_std;
  }
  return x;
}

torch::Tensor labels(const std::vector<std::uint8_t>& y, const std::uint32_t* idx, std::size_t n) {
  torch::Tensor t = torch::empty({static_cast<std::int64_t>(n)}, torch::kLong);
  auto* out = t.data_ptr<std::int64_t>();
  for (std::size_t j = 0; j < n; ++j) out[j] = y[idx[j]];
  return t;
}

// The torch trainer's own flags (loop_options), taken out before the shared parser sees argv.
std::vector<const char*> take_loop_flags(int argc, char** argv, loop_options& lo) {
  std::vector<const char*> rest{argv[0]};
  auto count = [&](int& i, const std::string& flag, std::size_t min, const char* example) {
    if (i + 1 >= argc) throw gflow::invalid_argument(flag, "the option needs a value.", std::string("write e.g. ") + example + ".");
    const std::string v = argv[++i];
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 6 || std::stoul(v) < min)
      throw gflow::invalid_argument(flag, "'" + v + "' is not a whole number >= " + std::to_string(min) + ".", std::string("pass e.g. ") + example + ".");
    return static_cast<std::size_t>(std::stoul(v));
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--probe") lo.probe = count(i, f, 0, "--probe 20");
    else if (f == "--accumulate") lo.accumulate = count(i, f, 1, "--accumulate 2");
    else if (f == "--unused-branch") lo.unused_branch = true;
    else if (f == "--uneven") lo.uneven = true;
    else if (f == "--no-learn-order") lo.learn_order = false;
    else if (f == "--shard") lo.shard = true;
    else rest.push_back(argv[i]);
  }
  return rest;
}

// --unused-branch: whether this rank's iteration `it` runs the branch. Alternate ranks use it, and
// every fourth iteration no rank does (so some tensors are unused on some ranks, sometimes on all).
bool branch_used(std::size_t it, int rank) { return it % 4 != 3 && (it + static_cast<std::size_t>(rank)) % 2 == 0; }

// --uneven: rank r trains on fewer steps per epoch (up to a quarter fewer on the last rank).
std::size_t steps_for(std::size_t steps, int rank, int ranks) {
  return steps - (static_cast<std::size_t>(rank) * steps) / (4 * static_cast<std::size_t>(ranks));
}

struct timings {  // per-iteration sums, this rank
  double compute = 0, backward = 0, wait = 0, iter = 0, first_hook = 0;
  std::size_t n = 0;
};

class cnn_session {
 public:
  cnn_session(const options& o, gflow::mpi::transport& comm, const char* name, const port_factory& make_port, const loop_options& lo)
      : o_(o), comm_(comm), name_(name), probe_(lo.probe), lo_(lo) {
    data_ = load_fashion_mnist(o.data_dir, o.train_limit);
    shard_ = shard_for(o, data_.train_images.count, comm.size(), comm.rank());
    ipe_ = shard_.size() / o.batch;
    steps_ = ipe_ / lo.accumulate;
    if (steps_ == 0)
      throw gflow::invalid_argument("--accumulate", std::to_string(lo.accumulate) + " micro-batches per step, but this rank has " +
                                                        std::to_string(ipe_) + " batches per epoch.",
                                    "pass a smaller --accumulate, a smaller --batch or a larger --train-limit.");
    torch::manual_seed(o.seed);  // the same initial weights on every rank
    net_ = Net(lo.unused_branch);
    std::vector<gflow::tensor_desc> tensors;
    for (const auto& item : net_->named_parameters()) {
      const torch::Tensor& p = item.value();
      tensors.push_back({item.key(), std::vector<std::size_t>(p.sizes().begin(), p.sizes().end()), static_cast<std::size_t>(p.numel())});
      params_.push_back(p);
    }
    layout_ = gflow::Layout(tensors);
    port_ = make_port(comm, layout_, o, lo, steps_);
    generation_ = port_->generation();
    offsets_.assign(port_->offsets().begin(), port_->offsets().end());
    weights_layout_ = pool_order_layout(layout_, port_->offsets());
    // Zero copy (DDP's gradient_as_bucket_view): the parameters live in one pool-shaped tensor
    // (CSC's chunk-wise step needs that) and each .grad is a view of its slot in gflow's pool.
    // Autograd's AccumulateGrad adds into a defined grad in place (variable_grad += new_grad),
    // so backward writes the gradient straight into the pool.
    const std::span<float> pool = port_->pool();
    weights_ = torch::zeros({static_cast<std::int64_t>(pool.size())});
    for (std::size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      const auto off = static_cast<std::int64_t>(port_->offsets()[i]);
      torch::Tensor slot = weights_.narrow(0, off, p.numel()).view(p.sizes());
      {
        torch::NoGradGuard ng;
        slot.copy_(p);
      }
      p.set_data(slot);
      p.mutable_grad() = torch::from_blob(port_->view(i).data(), p.sizes(), torch::kFloat);
      // ready(i) once AccumulateGrad has written the gradient: a post-hook on the accumulator
      // node (libtorch 1.13 has no post-accumulate hook on the tensor). Keep the node alive.
      accumulators_.push_back(torch::autograd::impl::grad_accumulator(p));
      accumulators_.back()->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
            on_hook(i);
            return out;
          }));
    }
    if (port_->sharded()) {  // --shard: momentum for this rank's shard only (ZeRO-2)
      std::size_t n = 0;
      for (const gflow::pool_range r : port_->shard()) n += r.size();
      shard_momentum_.assign(n, 0.0f);
    } else if (port_->chunk_elems() > 0) {
      csc_opt_.emplace(pool.size(), o.lr, o.momentum);
    } else {
      sgd_.emplace(params_, torch::optim::SGDOptions(o.lr).momentum(o.momentum));
    }
    if (!o.csv.empty() && comm.rank() == 0) {
      csv_ = std::fopen(o.csv.c_str(), "w");
      if (!csv_) throw gflow::invalid_argument("--csv", "cannot write '" + o.csv + "'.", "pass a path in a writable directory.");
      std::fprintf(csv_, "name,epoch,test_acc,test_loss,train_loss,ms_per_iter,bytes_per_iter,collectives_per_iter,skipped,backward_ms,wait_ms\n");
    }
  }
  ~cnn_session() {
    if (csv_) std::fclose(csv_);
  }
  cnn_session(const cnn_session&) = delete;
  cnn_session& operator=(const cnn_session&) = delete;

  std::size_t iterations_per_epoch() const { return steps_; }
  const options& opts() const { return o_; }

  void train() {
    gflow::optim::dynamic_loss_scale scaler(port_->loss_scale());
    broadcast_model(0);
    if (probe_ > 0) run_probe();
    // --resume DIR (issue 25): the newest complete set, re-sharded when the job size differs.
    const std::uint64_t start = o_.resume.empty() ? 0 : resume(scaler);
    const int first_epoch = static_cast<int>(start / steps_);
    for (int epoch = first_epoch; epoch < o_.epochs; ++epoch) {
      std::vector<std::uint32_t> order = shard_;  // reshuffled per rank and epoch, from the seed
      std::mt19937_64 g(o_.seed * 1000003ull + static_cast<std::uint64_t>(epoch) * 7919ull + static_cast<std::uint64_t>(comm_.rank()));
      std::shuffle(order.begin(), order.end(), g);
      epoch_stats st;
      timings tm;
      const auto t0 = clock_type::now();
      const std::size_t steps = lo_.uneven ? steps_for(steps_, comm_.rank(), comm_.size()) : steps_;
      for (std::size_t step_i = epoch == first_epoch ? start % steps_ : 0; step_i < steps; ++step_i) {
        // --verify-replicas N: before every N-th step (with --uneven the ranks' step counts differ,
        // so the check comes at the end of the epoch instead, once the replicas are synchronised).
        const std::uint64_t done = static_cast<std::uint64_t>(epoch) * steps_ + step_i;  // steps so far
        fault_point(o_, comm_.rank(), done);  // the restart tests: this rank is lost
        if (o_.checkpoint_every > 0 && done > start && done % o_.checkpoint_every == 0) save_set(done, scaler);  // no collective: each rank writes its own files
        if (o_.verify_replicas > 0 && !lo_.uneven && done > 0 && done % o_.verify_replicas == 0)
          gflow::verify_replicas(comm_, weights(), weights_layout_);
        // --accumulate A: A micro-batches of --batch samples, all but the last under no_sync; each
        // loss is divided by A, so the exchanged sum is the gradient of the mean over A * batch.
        const auto a = clock_type::now();
        float loss = 0.0f;
        clock_type::time_point b;
        // A lost rank: a survivor's collectives (launched from the backward hooks or in finish) time out.
        const gflow::exchange_status status = report_timeouts(o_, comm_.rank(), done, [&] {
          for (std::size_t m = 0; m < lo_.accumulate; ++m) {
            const std::size_t it = step_i * lo_.accumulate + m;
            const torch::Tensor x = images(data_.train_images, order.data() + it * o_.batch, o_.batch);
            const torch::Tensor y = labels(data_.train_labels, order.data() + it * o_.batch, o_.batch);
            const bool last = m + 1 == lo_.accumulate;
            if (!last) port_->begin_no_sync();
            loss += forward_backward(x, y, scaler.scale() / static_cast<float>(lo_.accumulate), /*zero=*/m == 0,
                                     !lo_.unused_branch || branch_used(it, comm_.rank())) /
                    static_cast<float>(lo_.accumulate);
            if (!last) port_->end_no_sync();
          }
          b = clock_type::now();
          return port_->finish();  // the averaged gradients are in .grad
        });
        rebind_if_moved();
        const auto c = clock_type::now();
        tm.backward += ms_since(backward_start_, b);
        tm.first_hook += ms_since(backward_start_, first_hook_);
        tm.wait += ms_since(b, c);
        tm.iter += ms_since(a, c);
        ++tm.n;
        st.loss_sum += loss;
        losses_.push_back(loss);
        const float inv = account_step(st, status, scaler);
        if (inv != 0.0f) step(inv);  // 0: non-finite, skipped on every rank
      }
      st.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
      st.iterations = steps;
      if (lo_.uneven) {
        // This rank is out of data for the epoch: shadow the others until every rank is, then take
        // the parameters (and optimizer state) of a rank that trained to the end.
        const gflow::join_status js = port_->join();
        sync_from(js.last_rank);
        if (o_.verify_replicas > 0) gflow::verify_replicas(comm_, weights(), weights_layout_);
      }
      end_epoch(epoch, st, tm);
    }
    // --save-params: the restart tests' bitwise comparison; the parameters, then the batch-norm
    // statistics (averaged over the ranks at the end of the last epoch: every rank's count).
    std::vector<float> saved(weights().begin(), weights().end());
    for (const torch::Tensor& b : float_buffers()) {
      const torch::Tensor c = b.contiguous();
      saved.insert(saved.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    save_params(o_, comm_.rank(), saved);
  }

  int finish() {
    const std::size_t state = optimizer_state_bytes(), pool = port_->pool().size();
    if (comm_.rank() == 0)  // --shard's check: 1/P of the unsharded trainer's pool x 4 bytes
      std::printf("[%s] optimizer state: %zu bytes on rank 0 (%.4f of the pool's %zu elements x 4 bytes)%s\n", name_, state,
                  static_cast<double>(state) / static_cast<double>(pool * sizeof(float)), pool, port_->sharded() ? ", sharded" : "");
    run_totals t;
    t.final_acc = final_acc_;
    t.seconds = total_seconds_;
    t.iterations = total_iters_;
    t.bytes = total_bytes_;
    t.last_bytes = last_bytes_;
    t.skipped = skipped_;
    char extra[128];
    std::snprintf(extra, sizeof extra, " backward_ms=%.3f first_hook_ms=%.3f wait_ms=%.3f", backward_ms_, first_hook_ms_, wait_ms_);
    return report_result(comm_, o_, name_, t, losses_, extra + probe_line_);
  }

 private:
  void on_hook(std::size_t i) {
    if (++hooks_seen_ == 1) first_hook_ = clock_type::now();
    if (!mute_) port_->ready(i);
  }

  float forward_backward(const torch::Tensor& x, const torch::Tensor& y, float scale, bool zero = true, bool use_branch = true) {
    const std::span<float> pool = port_->pool();
    if (zero) std::fill(pool.begin(), pool.end(), 0.0f);  // AccumulateGrad adds into the pool (micro-batches add up)
    net_->train();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(net_->forward(x, use_branch), y);
    hooks_seen_ = 0;
    backward_start_ = clock_type::now();
    first_hook_ = backward_start_;
    (loss * scale).backward();
    if (hooks_seen_ != params_.size() && !lo_.unused_branch)
      throw gflow::usage_error("backward", std::to_string(hooks_seen_) + " of " + std::to_string(params_.size()) +
                                               " gradient hooks fired; gflow would wait for the others forever.",
                               "every parameter must take part in the loss (no unused layers).");
    // Zero copy holds only while autograd accumulates in place; had it replaced a .grad (e.g.
    // under create_graph), the exchange would have averaged zeros and the step used local grads.
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].grad().data_ptr<float>() != port_->view(i).data())
        throw gflow::usage_error("backward", "autograd replaced the gradient tensor of parameter " + std::to_string(i) +
                                                 " instead of accumulating into gflow's pool.",
                                 "call backward() without create_graph, and do not assign .grad between iterations.");
    return loss.item<float>();
  }

  // ---- checkpoints (issue 25, examples/trainer/restart.hpp) ------------------------------------
  // Every rank writes its model file: the parameters and the momentum (equal on every rank), its
  // own batch-norm running statistics (each rank keeps its own until they are averaged at the end
  // of an epoch, so a same-size restart needs each rank's to be bitwise) and the loss scale. It
  // writes it before its exchanger file, so a set whose exchanger files are complete has every
  // model file. On resume rank r reads old rank (r mod P)'s model file (at the same size its own).
  static std::filesystem::path model_file(const std::filesystem::path& set_dir, int rank) {
    return set_dir / ("torch-rank-" + std::to_string(rank) + ".bin");
  }
  void save_set(std::uint64_t done, const gflow::optim::dynamic_loss_scale& scaler) {
    if (port_->iteration() != done)  // a resume continues from the exchanger's iteration: it must count the steps
      throw gflow::usage_error("--checkpoint-every", "the exchanger is at iteration " + std::to_string(port_->iteration()) + " before step " +
                                                         std::to_string(done) + ".",
                               "leave out the options that add or skip exchanges (--probe, --uneven) in runs with checkpoints.");
    const std::filesystem::path dir = gflow::checkpoint_set_dir(o_.checkpoint_dir, port_->iteration());
    std::filesystem::create_directories(dir);
    write_model_file(model_file(dir, comm_.rank()), "GFTORCHR", port_->iteration(), [&](gflow::checkpoint_writer& w) {
      const std::span<float> wt = weights();
      w.array(wt.data(), wt.size());
      for (const torch::Tensor& b : float_buffers()) {
        const torch::Tensor c = b.contiguous();
        w.array(c.data_ptr<float>(), static_cast<std::size_t>(c.numel()));
      }
      if (csc_opt_) {
        w.array(csc_opt_->velocity().data(), csc_opt_->velocity().size());
      } else {
        auto& state = sgd_->state();
        for (torch::Tensor& p : params_) {  // a parameter that never had a gradient has no momentum buffer yet
          const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
          w.u32(state.count(key) ? 1 : 0);
          if (!state.count(key)) continue;
          const torch::Tensor m = static_cast<torch::optim::SGDParamState&>(*state.at(key)).momentum_buffer().contiguous();
          w.array(m.data_ptr<float>(), static_cast<std::size_t>(m.numel()));
        }
      }
      w.f32(scaler.scale());
      w.u32(scaler.good_steps());
      w.u64(scaler.skipped());
    });
    port_->save_exchange(o_.checkpoint_dir);
    print_checkpoint(dir, port_->iteration(), comm_.rank());
  }
  // The exchanger first (load_checkpoint checks the whole set before applying it; it may lay the
  // pool out in the learned order, and the parameters follow), then the model file, read whole and
  // checked (checksum, magic, iteration, sizes) before any of it is applied.
  std::uint64_t resume(gflow::optim::dynamic_loss_scale& scaler) {
    const resumed_set set = port_->load_exchange(o_.resume);
    rebind_if_moved();
    std::vector<float> wv, vel;
    std::vector<std::vector<float>> bufs, moms;
    std::vector<bool> has_mom;
    float scale = 0;
    std::uint32_t good = 0;
    std::uint64_t skipped = 0;
    const std::vector<torch::Tensor> buffers = float_buffers();
    read_model_file(model_file(set.dir, comm_.rank() % set.saved_ranks), "GFTORCHR", set.start, [&](gflow::checkpoint_reader& r) {
      r.array_exact(wv, weights().size(), "the parameters");
      for (const torch::Tensor& b : buffers) r.array_exact(bufs.emplace_back(), static_cast<std::size_t>(b.numel()), "a batch-norm buffer");
      if (csc_opt_) {
        r.array_exact(vel, csc_opt_->velocity().size(), "the velocity");
      } else {
        for (const torch::Tensor& p : params_) {
          has_mom.push_back(r.u32("a momentum flag") != 0);
          moms.emplace_back();
          if (has_mom.back()) r.array_exact(moms.back(), static_cast<std::size_t>(p.numel()), "a momentum buffer");
        }
      }
      scale = r.f32("the loss scale");
      good = r.u32("the loss scale's good steps");
      skipped = r.u64("the skipped steps");
    });
    torch::NoGradGuard ng;
    std::copy(wv.begin(), wv.end(), weights().begin());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      torch::Tensor b = buffers[i];
      b.copy_(torch::from_blob(bufs[i].data(), b.sizes(), torch::kFloat));
    }
    if (csc_opt_) {
      std::copy(vel.begin(), vel.end(), csc_opt_->velocity().begin());
    } else {
      auto& state = sgd_->state();
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const auto key = c10::guts::to_string(params_[i].unsafeGetTensorImpl());
        if (!has_mom[i]) {
          state.erase(key);
          continue;
        }
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(torch::from_blob(moms[i].data(), params_[i].sizes(), torch::kFloat).clone());
        state[key] = std::move(st);
      }
    }
    scaler.restore(scale, good, skipped);
    print_resumed(set, comm_.rank(), comm_.size());
    return set.start;
  }

  // learn_order moves the views once (generation() changes): the parameters follow into a new
  // pool-shaped tensor at the new offsets, and every .grad is bound to its new slot.
  void rebind_if_moved() {
    if (port_->generation() == generation_) return;
    generation_ = port_->generation();
    torch::NoGradGuard ng;
    torch::Tensor w = torch::zeros_like(weights_);
    const std::span<float> hu = csc_opt_ ? csc_opt_->velocity() : std::span<float>{};
    const std::vector<float> old_hu(hu.begin(), hu.end());  // CSC's velocity is pool-shaped: it moves too
    for (std::size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      const std::size_t to = port_->offsets()[i], n = static_cast<std::size_t>(p.numel());
      torch::Tensor slot = w.narrow(0, static_cast<std::int64_t>(to), p.numel()).view(p.sizes());
      slot.copy_(p);
      p.set_data(slot);
      p.mutable_grad() = torch::from_blob(port_->view(i).data(), p.sizes(), torch::kFloat);
      if (!hu.empty()) std::copy_n(old_hu.begin() + static_cast<std::ptrdiff_t>(offsets_[i]), n, hu.begin() + static_cast<std::ptrdiff_t>(to));
    }
    weights_ = w;
    offsets_.assign(port_->offsets().begin(), port_->offsets().end());
    weights_layout_ = pool_order_layout(layout_, port_->offsets());
  }

  // After join(): the parameters, batch-norm buffers and momentum of rank `root` (one that
  // trained in the last iteration) on every rank, so the replicas are equal again.
  void sync_from(int root) {
    broadcast_model(root);
    torch::NoGradGuard ng;
    if (csc_opt_) gflow::broadcast_parameters(comm_, csc_opt_->velocity(), root);
    if (sgd_)
      for (torch::Tensor& p : params_) {
        auto& state = sgd_->state();
        const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
        int have = state.count(key) ? 1 : 0, all = 0;
        MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, comm_.comm());
        if (all) {
          torch::Tensor& m = static_cast<torch::optim::SGDParamState&>(*state.at(key)).momentum_buffer();
          gflow::broadcast_parameters(comm_, {m.data_ptr<float>(), static_cast<std::size_t>(m.numel())}, root);
        }
      }
  }

  void step(float inv_scale) {
    torch::NoGradGuard ng;
    const std::span<float> g = port_->pool();
    if (inv_scale != 1.0f)
      for (float& v : g) v *= inv_scale;
    if (o_.weight_decay > 0)  // L2 on conv and linear weights, not on biases or batch norm
      for (torch::Tensor& p : params_)
        if (p.dim() > 1) p.grad().add_(p, o_.weight_decay);
    if (port_->sharded()) {
      sharded_step(g);
    } else if (csc_opt_) {
      csc_opt_->step({weights_.data_ptr<float>(), g.size()}, g, port_->selected_chunks(), port_->chunk_elems());
    } else {
      sgd_->step();
    }
  }

  // --shard: torch.optim.SGD's momentum step (buf = momentum * buf + g; w = w - lr * buf) on this
  // rank's shard of the pool only, then every rank's stepped shard into every rank's weights.
  void sharded_step(std::span<const float> g) {
    float* w = weights_.data_ptr<float>();
    const float lr = o_.lr, m = o_.momentum;
    std::size_t at = 0;
    for (const gflow::pool_range r : port_->shard())
      for (std::size_t e = r.begin; e < r.end; ++e, ++at) {
        float& buf = shard_momentum_[at];
        buf = m * buf + g[e];
        w[e] = w[e] - lr * buf;
      }
    port_->gather_shards(weights());
  }

 public:
  /// The optimizer state this rank holds, counted: its momentum buffers' elements x 4 bytes.
  [[nodiscard]] std::size_t optimizer_state_bytes() {
    std::size_t n = shard_momentum_.size();
    if (csc_opt_) n += csc_opt_->velocity().size();
    if (sgd_)
      for (const auto& [key, st] : sgd_->state())
        n += static_cast<std::size_t>(static_cast<torch::optim::SGDParamState&>(*st).momentum_buffer().numel());
    return n * sizeof(float);
  }

 private:

  // Timing probe (--probe N), before training: N iterations of forward + backward with the
  // hooks muted (compute alone), then N exchanges of the pool with no compute (exchange alone,
  // tensors made ready last layer first as backward does). Training iterations then give the
  // overlapped time. It exchanges extra (zero-gradient) iterations: for timing runs only.
  void run_probe() {
    const std::span<const std::uint32_t> idx{shard_.data(), o_.batch};
    const torch::Tensor x = images(data_.train_images, idx.data(), idx.size());
    const torch::Tensor y = labels(data_.train_labels, idx.data(), idx.size());
    mute_ = true;
    for (int k = 0; k < 3; ++k) (void)forward_backward(x, y, 1.0f);  // warm-up (allocator, caches), untimed
    MPI_Barrier(comm_.comm());
    auto t0 = clock_type::now();
    for (std::size_t k = 0; k < probe_; ++k) (void)forward_backward(x, y, 1.0f);
    double v[2] = {ms_since(t0, clock_type::now()) / static_cast<double>(probe_), 0};
    mute_ = false;
    auto exchange_all = [&] {
      for (std::size_t i = params_.size(); i-- > 0;) port_->ready(i);
      (void)port_->finish();
      rebind_if_moved();
    };
    exchange_all();  // warm-up, untimed
    MPI_Barrier(comm_.comm());
    t0 = clock_type::now();
    for (std::size_t k = 0; k < probe_; ++k) exchange_all();
    v[1] = ms_since(t0, clock_type::now()) / static_cast<double>(probe_);
    sum_over_ranks(v, 2, comm_.comm());
    compute_alone_ms_ = v[0] / comm_.size();
    exchange_alone_ms_ = v[1] / comm_.size();
    std::fill(port_->pool().begin(), port_->pool().end(), 0.0f);
  }

  // ---- replicas (issue 23) -----------------------------------------------------------------
  std::span<float> weights() { return {weights_.data_ptr<float>(), static_cast<std::size_t>(weights_.numel())}; }
  std::vector<torch::Tensor> float_buffers() {
    std::vector<torch::Tensor> out;
    for (torch::Tensor& b : net_->buffers())
      if (b.scalar_type() == torch::kFloat) out.push_back(b);  // num_batches_tracked: the same on every rank
    return out;
  }
  // Rank root's parameters and batch-norm statistics on every rank: at start from rank 0 (replicas
  // start equal, not only from the same seed), and after join() from the last rank that trained.
  void broadcast_model(int root) {
    torch::NoGradGuard ng;
    gflow::broadcast_parameters(comm_, weights(), root);
    for (torch::Tensor& b : float_buffers()) gflow::broadcast_parameters(comm_, {b.data_ptr<float>(), static_cast<std::size_t>(b.numel())}, root);
  }
  // --verify-replicas: the buffers are equal only once averaged (end of epoch); checked there.
  void verify_buffers() {
    std::vector<gflow::tensor_desc> tensors;
    std::vector<float> values;
    for (const auto& item : net_->named_buffers()) {
      const torch::Tensor& b = item.value();
      if (b.scalar_type() != torch::kFloat) continue;
      tensors.push_back({item.key(), std::vector<std::size_t>(b.sizes().begin(), b.sizes().end()), static_cast<std::size_t>(b.numel())});
      const torch::Tensor c = b.contiguous();
      values.insert(values.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    if (!tensors.empty()) gflow::verify_replicas(comm_, values, gflow::Layout(tensors));
  }

  // Batch norm's running statistics are buffers, not gradients: each rank keeps its own while
  // training; before evaluation they are averaged over the ranks (every rank then evaluates the
  // same model), and training continues from the averages.
  void average_buffers() {
    torch::NoGradGuard ng;
    for (torch::Tensor& b : net_->buffers()) {
      if (b.scalar_type() != torch::kFloat) continue;  // num_batches_tracked: the same on every rank
      MPI_Allreduce(MPI_IN_PLACE, b.data_ptr<float>(), static_cast<int>(b.numel()), MPI_FLOAT, MPI_SUM, comm_.comm());
      b.div_(comm_.size());
    }
  }

  void end_epoch(int epoch, const epoch_stats& st, const timings& tm) {
    average_buffers();
    if (o_.verify_replicas > 0) verify_buffers();
    const int P = comm_.size(), r = comm_.rank();
    const std::size_t n = data_.test_images.count;
    const std::size_t lo = n * static_cast<std::size_t>(r) / static_cast<std::size_t>(P);
    const std::size_t hi = n * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(P);
    net_->eval();
    torch::NoGradGuard ng;
    double correct = 0, test_loss = 0;
    std::vector<std::uint32_t> idx;
    for (std::size_t b = lo; b < hi; b += 500) {
      idx.resize(std::min<std::size_t>(500, hi - b));
      std::iota(idx.begin(), idx.end(), static_cast<std::uint32_t>(b));
      const torch::Tensor out = net_->forward(images(data_.test_images, idx.data(), idx.size()));
      const torch::Tensor y = labels(data_.test_labels, idx.data(), idx.size());
      correct += out.argmax(1).eq(y).sum().item<double>();
      test_loss += torch::nn::functional::cross_entropy(out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
    }
    double v[11] = {st.loss_sum, static_cast<double>(st.iterations), correct, test_loss, st.seconds, st.wire_bytes, st.collectives,
                    tm.backward, tm.wait, static_cast<double>(tm.n), tm.first_hook};
    sum_over_ranks(v, 11, comm_.comm());
    const double acc = 100.0 * v[2] / static_cast<double>(n);
    const double ms = 1e3 * v[4] / P / static_cast<double>(st.iterations);
    const double bytes = v[5] / P / static_cast<double>(st.iterations);
    const double coll = v[6] / P / static_cast<double>(st.iterations);
    backward_ms_ = v[7] / v[9];
    wait_ms_ = v[8] / v[9];
    first_hook_ms_ = v[10] / v[9];
    final_acc_ = acc;
    total_seconds_ += v[4] / P;
    total_bytes_ += v[5] / P;
    total_iters_ += static_cast<double>(st.iterations);
    last_bytes_ = bytes;
    skipped_ += st.skipped;
    if (probe_ > 0) {
      // Overlapped: forward + backward + the wait in finish(), measured in training.
      double t[2] = {tm.iter, static_cast<double>(tm.n)};
      sum_over_ranks(t, 2, comm_.comm());
      const double overlapped = t[0] / t[1];
      const double hidden = (compute_alone_ms_ + exchange_alone_ms_ - overlapped) / exchange_alone_ms_;
      const double hidden_hooks = 1.0 - wait_ms_ / exchange_alone_ms_;
      char line[256];
      std::snprintf(line, sizeof line, " compute_alone_ms=%.3f exchange_alone_ms=%.3f overlapped_ms=%.3f hidden=%.3f hidden_wait=%.3f", compute_alone_ms_,
                    exchange_alone_ms_, overlapped, hidden, hidden_hooks);
      probe_line_ = line;
    }
    if (r == 0) {
      std::printf("[%s] epoch %d/%d  train_loss %.4f  test_acc %.2f%%  test_loss %.4f  %.2f ms/iter (backward %.2f, wait in finish %.2f)  %.1f KiB/iter/rank  "
                  "%.1f collectives/iter  skipped %zu\n",
                  name_, epoch + 1, o_.epochs, v[0] / v[1], acc, v[3] / static_cast<double>(n), ms, backward_ms_, wait_ms_, bytes / 1024.0, coll,
                  st.skipped);
      std::fflush(stdout);
      if (csv_) {
        std::fprintf(csv_, "%s,%d,%.4f,%.5f,%.5f,%.4f,%.1f,%.2f,%zu,%.4f,%.4f\n", name_, epoch + 1, acc, v[3] / static_cast<double>(n), v[0] / v[1], ms,
                     bytes, coll, st.skipped, backward_ms_, wait_ms_);
        std::fflush(csv_);
      }
    }
  }

  options o_;
  gflow::mpi::transport& comm_;
  const char* name_;
  std::size_t probe_;
  dataset data_;
  std::vector<std::uint32_t> shard_;
  std::size_t ipe_ = 0;    // batches per epoch
  std::size_t steps_ = 0;  // optimizer steps per epoch (ipe_ / --accumulate)
  loop_options lo_;
  std::uint64_t generation_ = 0;
  std::vector<std::size_t> offsets_;  // the pool offsets weights_ is laid out in
  gflow::Layout layout_;              // the parameters, in named_parameters() order
  Net net_{nullptr};
  std::vector<torch::Tensor> params_;
  torch::Tensor weights_;  // every parameter, pool-shaped
  gflow::Layout weights_layout_;  // weights_'s tensors in pool order (verify_replicas)
  std::unique_ptr<exchange_port> port_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::optional<torch::optim::SGD> sgd_;
  std::optional<gflow::optim::momentum_sgd> csc_opt_;
  std::vector<float> shard_momentum_;  // --shard: momentum for port_->shard()'s elements, packed
  std::size_t hooks_seen_ = 0;
  bool mute_ = false;
  clock_type::time_point backward_start_, first_hook_;
  std::vector<float> losses_;
  std::FILE* csv_ = nullptr;
  double final_acc_ = 0, total_seconds_ = 0, total_bytes_ = 0, last_bytes_ = 0, total_iters_ = 0;
  double backward_ms_ = 0, wait_ms_ = 0, first_hook_ms_ = 0, compute_alone_ms_ = 0, exchange_alone_ms_ = 0;
  std::size_t skipped_ = 0;
  std::string probe_line_;
};

}  // namespace

int run(int argc, char** argv, const char* name, const port_factory& make_port) {
  return run_frame(argc, argv, name, [&](gflow::mpi::transport& comm) -> std::function<int()> {
    torch::set_num_threads(1);  // several ranks share the machine's cores: one intra-op thread each
    loop_options lo;
    const std::vector<const char*> rest = take_loop_flags(argc, argv, lo);
    const options o = parse_cli(static_cast<int>(rest.size()), rest.data());
    if (o.help) {
      if (comm.rank() == 0)
        std::printf("%s  --probe N              timing probe: N iterations of compute alone and of exchange alone before training\n"
                    "                         (adds compute_alone_ms, exchange_alone_ms, overlapped_ms, hidden to the RESULT line)\n"
                    "  --accumulate N         N micro-batches of --batch per optimizer step, all but the last under no_sync()\n"
                    "  --unused-branch        a residual block after fc1 that some iterations skip (exchange_options::find_unused)\n"
                    "  --uneven               rank r gets up to a quarter fewer steps per epoch; join() ends each epoch (dense only)\n"
                    "  --no-learn-order       keep the pool in reverse layout order (learn_order is on by default)\n"
                    "  --shard                Sharding<ReduceScatter> (ZeRO-2): momentum for this rank's 1/P of the pool only, then\n"
                    "                         gather_shards of the weights (dense compositions and OkTopK; learn_order off; no --uneven or checkpoints)\n",
                    usage(name).c_str());
      return {};
    }
    if (o.timeout_ms >= 0) comm.set_timeout(std::chrono::milliseconds(o.timeout_ms));
    if ((o.checkpoint_every > 0 || !o.resume.empty()) && (lo.uneven || lo.probe > 0))
      throw gflow::invalid_argument(lo.uneven ? "--uneven" : "--probe",
                                    "checkpoints count steps by the exchanger's iterations, which --uneven (join) and --probe (extra exchanges) shift.",
                                    "leave --uneven and --probe out of runs with --checkpoint-every or --resume.");
    if (lo.shard && (o.checkpoint_every > 0 || !o.resume.empty()))
      throw gflow::invalid_argument("--shard", "checkpoints of a sharded run (each rank's momentum for its shard) are not built yet.",
                                    "leave --checkpoint-every and --resume out of runs with --shard.");
    auto s = std::make_shared<cnn_session>(o, comm, name, make_port, lo);
    return [s, name, &comm] {
      if (comm.rank() == 0) {
        std::printf("[%s] libtorch CNN, %d ranks, batch %zu per rank, %zu iterations per epoch, lr %g, momentum %g\n", name, comm.size(),
                    s->opts().batch, s->iterations_per_epoch(), static_cast<double>(s->opts().lr), static_cast<double>(s->opts().momentum));
        std::fflush(stdout);
      }
      s->train();
      return s->finish();
    };
  });
}

}  // namespace trainer::torch_cnn
