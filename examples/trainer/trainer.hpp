#pragma once
// The policy-independent half of the Fashion-MNIST trainer: options, IDX loading, the MLP
// (Eigen, kept out of this header so experiment translation units never compile it), batches,
// evaluation and reporting. It is compiled once into the static library gflow_trainer; each
// experiment binary only instantiates train_loop.hpp's loop for its Exchanger type.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

// layering: layout.hpp alone, not <gflow/exchanger.hpp>: the trainer's policy-independent library
// (options, data, model, reports) needs gflow::Layout only; every trainer translation unit includes this header.
#include <gflow/layout.hpp>
#include <gflow/transport/mpi.hpp>

namespace trainer {

inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

enum class loss_scale_mode { automatic, none, fixed, dynamic };

struct options {
  std::string data_dir = default_data_dir;
  int epochs = 3;
  std::size_t batch = 32;          // per rank
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 1;
  std::size_t train_limit = 0;     // 0: the whole training set
  std::int64_t warmup_iters = -1;  // sparse warm-up; -1: half an epoch
  loss_scale_mode loss_scale = loss_scale_mode::automatic;  // automatic: dynamic on a 16-bit wire
  float loss_scale_value = 32768.0f;
  std::uint32_t loss_scale_window = 500;
  float lars = 0.0f;               // LARS coefficient; 0: off
  float rho = 0.0f;                // EASGD coupling; 0: 0.9 / (lr * P)
  double check_acc = -1.0;         // >= 0: exit 3 unless final accuracy >= this and the loss fell
  std::string csv;                 // per-epoch rows (rank 0)
  std::string trace;               // Chrome trace of the exchanges (every rank, written by rank 0)
  std::uint64_t verify_replicas = 0;  // --verify-replicas N: gflow::verify_replicas every N steps; 0: off
  // issue 25: checkpoints, restart on another number of ranks, fault injection for the tests
  std::uint64_t checkpoint_every = 0;  // --checkpoint-every K: a checkpoint set every K steps; 0: off
  std::string checkpoint_dir = "gflow-checkpoints";  // --checkpoint-dir DIR: where the sets go (DIR/iter-<n>/)
  std::string resume;                  // --resume DIR: start from DIR's newest complete set (re-sharded if P differs)
  std::int64_t timeout_ms = -1;        // --timeout-ms MS: the transport's timeout; -1: its default (10 min)
  int fault_rank = -1;                 // --fault-rank R --fault-at N: rank R exits without MPI_Finalize before step N
  std::uint64_t fault_at = 0;
  std::string save_params;             // --save-params FILE: rank 0 writes the final parameters (raw float32)
  bool help = false;
};

/// Parses the command line; throws gflow::invalid_argument naming the flag and the fix.
options parse_cli(int argc, const char* const* argv);
std::string usage(const std::string& program);

// ---- Fashion-MNIST (IDX files, gzip) --------------------------------------------------------
struct idx_images {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, row-major per image
};
/// Reads a gzip-compressed IDX3 image file (magic 0x00000803), 28x28 images.
idx_images load_idx_images(const std::string& path);
/// Reads a gzip-compressed IDX1 label file (magic 0x00000801), labels 0..9.
std::vector<std::uint8_t> load_idx_labels(const std::string& path);

struct dataset {
  idx_images train_images, test_images;
  std::vector<std::uint8_t> train_labels, test_labels;
};
/// The four files of `dir`; train_limit > 0 keeps the first train_limit training samples.
dataset load_fashion_mnist(const std::string& dir, std::size_t train_limit = 0);

// ---- the model -------------------------------------------------------------------------------
/// MLP 784-256-128-10, ReLU, softmax cross-entropy. Parameters live in ONE pool-shaped buffer
/// (the exchanger's pool order, gflow::plan_pool), so the optimizers, CSC's chunk-wise step and
/// elastic averaging see the model as one contiguous array.
gflow::Layout mlp_layout();

/// Where backward puts tensor i's gradient and whom it tells (the exchanger, or a plain buffer).
struct grad_sink {
  std::function<std::span<float>(std::size_t)> view;
  std::function<void(std::size_t)> ready;
};

struct epoch_stats {
  double seconds = 0;        // training iterations only (no evaluation)
  std::size_t iterations = 0;
  double wire_bytes = 0;     // summed over iterations, this rank
  double collectives = 0;
  double loss_sum = 0;       // of this rank's batch losses
  std::size_t skipped = 0;   // non-finite steps
};

/// One rank's training session: data shard, batches, model math, evaluation and reports.
class session {
 public:
  session(const options& o, gflow::mpi::transport& comm, std::string name);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  [[nodiscard]] const options& opts() const noexcept;
  [[nodiscard]] gflow::mpi::transport& comm() noexcept;
  [[nodiscard]] const gflow::Layout& layout() const noexcept;
  [[nodiscard]] std::span<const std::size_t> offsets() const noexcept;  // pool offset per tensor
  [[nodiscard]] std::span<float> params() noexcept;                     // pool-shaped
  [[nodiscard]] std::size_t iterations_per_epoch() const noexcept;

  /// Loads batch `it` of `epoch` (this rank's shard, reshuffled each epoch), runs forward and
  /// backward with the loss multiplied by loss_scale, writing each gradient into sink.view(i)
  /// and calling sink.ready(i) last layer first. Returns the batch's (unscaled) mean loss.
  float train_batch(int epoch, std::size_t it, std::span<const float> params, const grad_sink& sink, float loss_scale);

  /// Before the optimizer step: g *= inv_scale, weight decay on weight matrices, LARS if asked.
  void prepare_gradients(std::span<float> grad_pool, float inv_scale);

  /// Evaluates `params` on the test set (split over ranks), prints the epoch line on rank 0.
  void end_epoch(int epoch, std::span<const float> params, const epoch_stats& st);
  /// Prints the result line; returns the process exit code (3 when --check-acc fails).
  int finish();

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// Rank `rank`'s training samples: a global shuffle from o.seed (the same on every rank), every
/// ranks-th sample, cut to equal shards so every rank runs the same number of iterations.
/// invalid_argument when a rank would get no sample or less than one batch.
std::vector<std::uint32_t> shard_for(const options& o, std::size_t n, int ranks, int rank);
/// Sums v[0, n) over the ranks (the trainer's statistics); transport_error on failure.
void sum_over_ranks(double* v, int n, MPI_Comm comm);
/// Setup (options, data, model) may fail on some ranks only: agree before any collective of the
/// training loop. The lowest failing rank prints its error; false when any rank failed.
bool agree_setup(gflow::mpi::transport& comm, const std::string& err, const char* name);

/// The layout of a pool-shaped buffer (tensor i at offsets[i]): the tensors in buffer order, so
/// that gflow::verify_replicas can read the model's parameters as they lie in memory.
gflow::Layout pool_order_layout(const gflow::Layout& layout, std::span<const std::size_t> offsets);

/// What the RESULT line reports about a whole run (rank-averaged where it says so).
struct run_totals {
  double final_acc = 0;      // percent, last evaluation
  double seconds = 0;        // training iterations only, mean over ranks
  double iterations = 0;     // per rank
  double bytes = 0;          // wire bytes per rank, summed over iterations
  double last_bytes = 0;     // per iteration in the last epoch
  std::size_t skipped = 0;   // non-finite steps
};
/// Ends a run: did the loss fall (mean of the first and of the last tenth of `losses`, this
/// rank's per-iteration losses, averaged over the ranks), the RESULT line on rank 0 with `extra`
/// (" key=value ...") appended, and CHECK FAILED when --check-acc is not met. Returns the exit code
/// (3 when the check fails). A collective: every rank calls it.
int report_result(gflow::mpi::transport& comm, const options& o, const std::string& name, const run_totals& t, std::span<const float> losses,
                  const std::string& extra = "");

/// The program frame: the MPI environment, then `setup` (options, data, model), which may fail
/// on some ranks only: they agree before any collective and the lowest failing rank prints its
/// error (exit 2). setup returns the body to run, or an empty function when it printed --help
/// (exit 0). An exception inside the body aborts every rank (it may leave others in a collective).
int run_frame(int argc, char** argv, const char* name, const std::function<std::function<int()>(gflow::mpi::transport&)>& setup);

/// MPI setup, option parsing, errors -> messages and exit codes, then `body` (the loop).
int run_main(int argc, char** argv, const char* name, const std::function<void(session&)>& body);
/// The elastic-averaging experiment (no gradient exchanger): whole program.
int main_easgd(int argc, char** argv, const char* name);

}  // namespace trainer
