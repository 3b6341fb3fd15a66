// The trainer's session: shard, batches, the MLP's forward and backward (Eigen), evaluation,
// reports, and the program frame (MPI, errors, exit codes).
#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/optim/lars.hpp>
// The model's parameters are laid out in the exchanger's pool order (gflow::plan_pool), so the
// optimizers step on the exchanged pool in place, without the exchanger.
#include <gflow/pool.hpp>

#include "trainer.hpp"

namespace trainer {

namespace {
using Mat = Eigen::MatrixXf;
using Vec = Eigen::VectorXf;
using MapM = Eigen::Map<Mat>;
using MapV = Eigen::Map<Vec>;
using CMapM = Eigen::Map<const Mat>;
using CMapV = Eigen::Map<const Vec>;

constexpr std::size_t in_dim = 784, h1 = 256, h2 = 128, classes = 10;
// Fashion-MNIST's pixel mean and standard deviation (on [0, 1]).
constexpr float pixel_mean = 0.2860f, pixel_std = 0.3530f;

// Pixels of the listed samples -> normalised columns of x (784 x n).
void fill_batch(const idx_images& im, const std::uint32_t* idx, std::size_t n, Mat& x) {
  x.resize(in_dim, static_cast<Eigen::Index>(n));
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint8_t* px = im.pixels.data() + std::size_t{idx[j]} * in_dim;
    float* col = x.data() + j * in_dim;
    for (std::size_t k = 0; k < in_dim; ++k) col[k] = (static_cast<float>(px[k]) * (1.0f / 255.0f) - pixel_mean) / pixel_std;
  }
}

// Column-wise softmax in place; returns the summed cross-entropy against labels y.
double softmax_xent(Mat& z, const std::uint8_t* y, std::size_t* correct) {
  double loss = 0.0;
  for (Eigen::Index j = 0; j < z.cols(); ++j) {
    auto c = z.col(j);
    Eigen::Index arg = 0;
    const float mx = c.maxCoeff(&arg);
    if (correct && static_cast<std::uint8_t>(arg) == y[j]) ++*correct;
    c = (c.array() - mx).exp().matrix();
    const float sum = c.sum();
    c /= sum;
    loss -= std::log(std::max(c(y[j]), 1e-30f));
  }
  return loss;
}

}  // namespace

void sum_over_ranks(double* v, int n, MPI_Comm comm) {
  if (const int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, comm); rc != MPI_SUCCESS)
    throw gflow::transport_error("MPI_Allreduce", "the trainer's statistics allreduce failed (MPI error " + std::to_string(rc) + ").",
                                 "check the MPI installation; every rank must run the same binary with the same options.");
}
std::vector<std::uint32_t> shard_for(const options& o, std::size_t n, int ranks, int rank) {
  const std::size_t P = static_cast<std::size_t>(ranks);
  if (P > n)
    throw gflow::invalid_argument("ranks", std::to_string(P) + " ranks but only " + std::to_string(n) + " training samples: some ranks would get none.",
                                  "run with at most " + std::to_string(n) + " ranks (mpiexec -n), or raise --train-limit.");
  if (n / P < o.batch)
    throw gflow::invalid_argument("--batch", "each rank's shard holds " + std::to_string(n / P) + " samples, fewer than one batch of " +
                                                 std::to_string(o.batch) + ".",
                                  "pass --batch " + std::to_string(n / P) + " or less, use fewer ranks, or raise --train-limit.");
  // Shards: a fixed global shuffle (same seed on every rank), rank r takes every P-th sample.
  std::vector<std::uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 g(o.seed);
  std::shuffle(all.begin(), all.end(), g);
  const std::size_t r = static_cast<std::size_t>(rank);
  std::vector<std::uint32_t> shard;
  for (std::size_t i = r; i < n; i += P) shard.push_back(all[i]);
  shard.resize(n / P);  // equal shards: every rank runs the same number of iterations
  return shard;
}

bool agree_setup(gflow::mpi::transport& comm, const std::string& err, const char* name) {
  const int P = comm.size();
  int first_failed = err.empty() ? P : comm.rank();
  MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, comm.comm());
  if (first_failed < P && comm.rank() == first_failed) std::fprintf(stderr, "%s: %s\n", name, err.c_str());
  return first_failed == P;
}

gflow::Layout mlp_layout() {
  return gflow::Layout({{"fc1.weight", {h1, in_dim}, h1 * in_dim},
                        {"fc1.bias", {h1}, h1},
                        {"fc2.weight", {h2, h1}, h2 * h1},
                        {"fc2.bias", {h2}, h2},
                        {"fc3.weight", {classes, h2}, classes * h2},
                        {"fc3.bias", {classes}, classes}});
}

struct session::impl {
  options o;
  gflow::mpi::transport* comm;
  std::string name;
  dataset data;
  gflow::Layout layout = mlp_layout();
  std::vector<std::size_t> off;
  std::vector<float> params;
  std::vector<std::uint32_t> shard;  // this rank's training samples
  std::vector<std::uint32_t> order;  // the shard shuffled for the current epoch
  int order_epoch = -1;
  std::size_t ipe = 0;
  // activations, kept between forward and backward
  Mat x, z1, a1, z2, a2, z3, d3, d2, d1;
  // Bias gradients are reduced into these (Eigen-aligned) vectors, then copied into the pool.
  // Reducing straight into a pool view made the result depend on the view's address: Eigen
  // peels unaligned leading elements into a scalar path that sums in another order, and the
  // pool's alignment varies from run to run with the heap, so runs were not reproducible.
  Vec gb1, gb2, gb3;
  std::vector<std::uint8_t> labels;  // the batch's labels (kept: no allocation per iteration)
  std::vector<float> losses;  // per iteration, this rank
  std::FILE* csv = nullptr;
  double final_acc = 0, total_seconds = 0, total_bytes = 0, last_bytes = 0, total_iters = 0, last_iters = 0;
  std::size_t skipped = 0;

  float* w(std::size_t i) { return params.data() + off[i]; }
};

session::session(const options& o, gflow::mpi::transport& comm, std::string name) : p_(std::make_unique<impl>()) {
  impl& s = *p_;
  s.o = o;
  s.comm = &comm;
  s.name = std::move(name);
  s.data = load_fashion_mnist(o.data_dir, o.train_limit);
  s.shard = shard_for(o, s.data.train_images.count, comm.size(), comm.rank());
  s.ipe = s.shard.size() / o.batch;

  // Parameters in pool order; He initialisation from the seed, identical on every rank.
  const auto plan = gflow::plan_pool(s.layout);
  s.off.assign(plan.offset.begin(), plan.offset.end());
  s.params.assign(plan.total, 0.0f);
  std::mt19937_64 init(o.seed ^ 0x9e3779b97f4a7c15ull);
  for (std::size_t i = 0; i < s.layout.size(); i += 2) {  // weights; biases stay zero
    std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / static_cast<float>(s.layout[i].shape[1])));
    float* p = s.w(i);
    for (std::size_t k = 0; k < s.layout[i].numel; ++k) p[k] = nd(init);
  }
  if (!o.csv.empty() && comm.rank() == 0) {
    s.csv = std::fopen(o.csv.c_str(), "w");
    if (!s.csv) throw gflow::invalid_argument("--csv", "cannot write '" + o.csv + "'.", "pass a path in a writable directory.");
    std::fprintf(s.csv, "name,epoch,test_acc,test_loss,train_loss,ms_per_iter,bytes_per_iter,collectives_per_iter,skipped\n");
  }
}

session::~session() {
  if (p_ && p_->csv) std::fclose(p_->csv);
}

gflow::Layout pool_order_layout(const gflow::Layout& layout, std::span<const std::size_t> offsets) {
  std::vector<std::size_t> by_offset(layout.size());
  for (std::size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) { return offsets[a] < offsets[b]; });
  std::vector<gflow::tensor_desc> tensors;
  for (std::size_t i : by_offset) tensors.push_back(layout[i]);
  return gflow::Layout(std::move(tensors));
}

const options& session::opts() const noexcept { return p_->o; }
gflow::mpi::transport& session::comm() noexcept { return *p_->comm; }
const gflow::Layout& session::layout() const noexcept { return p_->layout; }
std::span<const std::size_t> session::offsets() const noexcept { return p_->off; }
std::span<float> session::params() noexcept { return p_->params; }
std::size_t session::iterations_per_epoch() const noexcept { return p_->ipe; }

float session::train_batch(int epoch, std::size_t it, std::span<const float> params, const grad_sink& sink, float loss_scale) {
  impl& s = *p_;
  if (s.order_epoch != epoch) {  // reshuffle the shard: per rank and epoch, from the seed
    s.order = s.shard;
    std::mt19937_64 g(s.o.seed * 1000003ull + static_cast<std::uint64_t>(epoch) * 7919ull + static_cast<std::uint64_t>(s.comm->rank()));
    std::shuffle(s.order.begin(), s.order.end(), g);
    s.order_epoch = epoch;
  }
  const std::size_t B = s.o.batch;
  const std::uint32_t* idx = s.order.data() + it * B;
  fill_batch(s.data.train_images, idx, B, s.x);
  s.labels.resize(B);
  const std::uint8_t* y = s.labels.data();
  for (std::size_t j = 0; j < B; ++j) s.labels[j] = s.data.train_labels[idx[j]];

  const float* p = params.data();
  const CMapM W1(p + s.off[0], h1, in_dim), W2(p + s.off[2], h2, h1), W3(p + s.off[4], classes, h2);
  const CMapV b1(p + s.off[1], h1), b2(p + s.off[3], h2), b3(p + s.off[5], classes);
  // forward
  s.z1.noalias() = W1 * s.x;
  s.z1.colwise() += b1;
  s.a1 = s.z1.cwiseMax(0.0f);
  s.z2.noalias() = W2 * s.a1;
  s.z2.colwise() += b2;
  s.a2 = s.z2.cwiseMax(0.0f);
  s.z3.noalias() = W3 * s.a2;
  s.z3.colwise() += b3;
  const double loss = softmax_xent(s.z3, y, nullptr) / static_cast<double>(B);
  // backward, last layer first; each gradient goes straight into its view, then ready(i)
  s.d3 = s.z3;  // softmax probabilities
  for (std::size_t j = 0; j < B; ++j) s.d3(y[j], static_cast<Eigen::Index>(j)) -= 1.0f;
  s.d3 *= loss_scale / static_cast<float>(B);
  auto view = [&](std::size_t i) {
    const std::span<float> v = sink.view(i);
    return v.data();
  };
  s.gb3 = s.d3.rowwise().sum();
  MapV(view(5), classes) = s.gb3;
  sink.ready(5);
  MapM(view(4), classes, h2).noalias() = s.d3 * s.a2.transpose();
  sink.ready(4);
  s.d2.noalias() = W3.transpose() * s.d3;
  s.d2 = s.d2.cwiseProduct((s.z2.array() > 0.0f).cast<float>().matrix());
  s.gb2 = s.d2.rowwise().sum();
  MapV(view(3), h2) = s.gb2;
  sink.ready(3);
  MapM(view(2), h2, h1).noalias() = s.d2 * s.a1.transpose();
  sink.ready(2);
  s.d1.noalias() = W2.transpose() * s.d2;
  s.d1 = s.d1.cwiseProduct((s.z1.array() > 0.0f).cast<float>().matrix());
  s.gb1 = s.d1.rowwise().sum();
  MapV(view(1), h1) = s.gb1;
  sink.ready(1);
  MapM(view(0), h1, in_dim).noalias() = s.d1 * s.x.transpose();
  sink.ready(0);
  s.losses.push_back(static_cast<float>(loss));
  return static_cast<float>(loss);
}

void session::prepare_gradients(std::span<float> g, float inv_scale) {
  impl& s = *p_;
  if (inv_scale != 1.0f)
    for (float& v : g) v *= inv_scale;
  const gflow::optim::lars lars({s.o.lars > 0 ? s.o.lars : 1.0f, s.o.weight_decay});
  for (std::size_t i = 0; i < s.layout.size(); ++i) {
    const bool weight = (i % 2) == 0;  // no decay on biases (Jia et al.)
    const std::span<const float> w{s.w(i), s.layout[i].numel};
    const std::span<float> gi{g.data() + s.off[i], s.layout[i].numel};
    if (s.o.lars > 0) lars.apply(w, gi, weight ? s.o.weight_decay : 0.0f);
    else if (weight && s.o.weight_decay > 0)
      for (std::size_t k = 0; k < gi.size(); ++k) gi[k] += s.o.weight_decay * w[k];
  }
}

void session::end_epoch(int epoch, std::span<const float> params, const epoch_stats& st) {
  impl& s = *p_;
  const int P = s.comm->size(), r = s.comm->rank();
  // Evaluate this rank's slice of the test set, in blocks.
  const std::size_t n = s.data.test_images.count;
  const std::size_t lo = n * static_cast<std::size_t>(r) / static_cast<std::size_t>(P);
  const std::size_t hi = n * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(P);
  const float* p = params.data();
  const CMapM W1(p + s.off[0], h1, in_dim), W2(p + s.off[2], h2, h1), W3(p + s.off[4], classes, h2);
  const CMapV b1(p + s.off[1], h1), b2(p + s.off[3], h2), b3(p + s.off[5], classes);
  std::size_t correct = 0;
  double test_loss = 0;
  std::vector<std::uint32_t> idx;
  Mat x, z1, z2, z3;
  for (std::size_t b = lo; b < hi; b += 500) {
    const std::size_t m = std::min<std::size_t>(500, hi - b);
    idx.resize(m);
    std::iota(idx.begin(), idx.end(), static_cast<std::uint32_t>(b));
    fill_batch(s.data.test_images, idx.data(), m, x);
    z1.noalias() = W1 * x;
    z1.colwise() += b1;
    z1 = z1.cwiseMax(0.0f);
    z2.noalias() = W2 * z1;
    z2.colwise() += b2;
    z2 = z2.cwiseMax(0.0f);
    z3.noalias() = W3 * z2;
    z3.colwise() += b3;
    test_loss += softmax_xent(z3, s.data.test_labels.data() + b, &correct);
  }
  double v[7] = {st.loss_sum, static_cast<double>(st.iterations), static_cast<double>(correct), test_loss, st.seconds, st.wire_bytes, st.collectives};
  sum_over_ranks(v, 7, s.comm->comm());
  const double acc = 100.0 * v[2] / static_cast<double>(n);
  const double train_loss = v[0] / v[1];
  const double ms = 1e3 * v[4] / P / static_cast<double>(st.iterations);
  const double bytes = v[5] / P / static_cast<double>(st.iterations);
  const double coll = v[6] / P / static_cast<double>(st.iterations);
  s.final_acc = acc;
  s.total_seconds += v[4] / P;
  s.total_bytes += v[5] / P;
  s.total_iters += static_cast<double>(st.iterations);
  s.last_bytes = bytes;
  s.skipped += st.skipped;
  if (r == 0) {
    std::printf("[%s] epoch %d/%d  train_loss %.4f  test_acc %.2f%%  test_loss %.4f  %.2f ms/iter  %.1f KiB/iter/rank  %.1f collectives/iter  skipped %zu\n",
                s.name.c_str(), epoch + 1, s.o.epochs, train_loss, acc, v[3] / static_cast<double>(n), ms, bytes / 1024.0, coll, st.skipped);
    std::fflush(stdout);
    if (s.csv) {
      std::fprintf(s.csv, "%s,%d,%.4f,%.5f,%.5f,%.4f,%.1f,%.2f,%zu\n", s.name.c_str(), epoch + 1, acc, v[3] / static_cast<double>(n), train_loss,
                   ms, bytes, coll, st.skipped);
      std::fflush(s.csv);
    }
  }
}

int session::finish() {
  impl& s = *p_;
  run_totals t;
  t.final_acc = s.final_acc;
  t.seconds = s.total_seconds;
  t.iterations = s.total_iters;
  t.bytes = s.total_bytes;
  t.last_bytes = s.last_bytes;
  t.skipped = s.skipped;
  return report_result(*s.comm, s.o, s.name, t, s.losses);
}

int report_result(gflow::mpi::transport& comm, const options& o, const std::string& name, const run_totals& t, std::span<const float> losses,
                  const std::string& extra) {
  // Did the loss fall? Mean of the first and of the last tenth of the iterations (>= 1 each).
  const std::size_t n = losses.size();
  const std::size_t k = std::max<std::size_t>(1, n / 10);
  double v[2] = {0, 0};
  for (std::size_t i = 0; i < k && i < n; ++i) {
    v[0] += losses[i];
    v[1] += losses[n - 1 - i];
  }
  sum_over_ranks(v, 2, comm.comm());
  const double first = v[0] / (static_cast<double>(k) * comm.size()), last = v[1] / (static_cast<double>(k) * comm.size());
  const bool ok = o.check_acc < 0 || (t.final_acc >= o.check_acc && last < first);
  if (comm.rank() == 0) {
    std::printf("RESULT name=%s ranks=%d epochs=%d batch=%zu test_acc=%.2f ms_per_iter=%.3f bytes_per_iter=%.0f bytes_mean=%.0f loss_first=%.4f loss_last=%.4f skipped=%zu%s\n",
                name.c_str(), comm.size(), o.epochs, o.batch, t.final_acc, 1e3 * t.seconds / std::max(1.0, t.iterations), t.last_bytes,
                t.bytes / std::max(1.0, t.iterations), first, last, t.skipped, extra.c_str());
    if (!ok)
      std::printf("CHECK FAILED: final test accuracy %.2f%% (floor %.2f%%), training loss %.4f -> %.4f (must fall)\n", t.final_acc, o.check_acc, first, last);
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

int run_frame(int argc, char** argv, const char* name, const std::function<std::function<int()>(gflow::mpi::transport&)>& setup) {
  std::optional<gflow::mpi::environment> env;
  try {
    env.emplace(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
  gflow::mpi::transport comm;
  std::function<int()> body;
  std::string err;
  try {
    body = setup(comm);
    if (!body) return 0;  // --help
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (!agree_setup(comm, err, name)) return 2;
  try {
    return body();
  } catch (const std::exception& e) {
    // A failure inside the loop may leave other ranks waiting in a collective: abort them all.
    std::fprintf(stderr, "%s (rank %d): %s\n", name, comm.rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}

int run_main(int argc, char** argv, const char* name, const std::function<void(session&)>& body) {
  return run_frame(argc, argv, name, [&](gflow::mpi::transport& comm) -> std::function<int()> {
    const options o = parse_cli(argc, argv);
    if (o.timeout_ms >= 0) comm.set_timeout(std::chrono::milliseconds(o.timeout_ms));
    if (o.help) {
      if (comm.rank() == 0) std::fputs(usage(name).c_str(), stdout);
      return {};
    }
    auto s = std::make_shared<session>(o, comm, name);
    return [s, &body, name, &comm] {
      const int P = comm.size();
      if (comm.rank() == 0) {
        std::printf("[%s] %d ranks, %zu training samples per epoch (%zu per rank), batch %zu per rank, %zu iterations per epoch, lr %g, momentum %g%s\n", name, P,
                    s->iterations_per_epoch() * s->opts().batch * static_cast<std::size_t>(P), s->iterations_per_epoch() * s->opts().batch,
                    s->opts().batch, s->iterations_per_epoch(), static_cast<double>(s->opts().lr), static_cast<double>(s->opts().momentum),
                    s->opts().lars > 0 ? ", LARS" : "");
        std::fflush(stdout);
      }
      body(*s);
      return s->finish();
    };
  });
}

}  // namespace trainer
