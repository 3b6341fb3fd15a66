// Command-line options of every experiment binary. A bad flag or value is a
// gflow::invalid_argument whose subject is the flag and whose fix says what to pass.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include <gflow/error.hpp>

#include "trainer.hpp"

namespace trainer {
namespace {

double parse_number(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(x))
    throw gflow::invalid_argument(flag, "'" + v + "' is not a finite number.", "pass a number, e.g. " + flag + " 0.05.");
  return x;
}

std::uint64_t parse_count(const std::string& flag, const std::string& v, std::uint64_t min) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || end != v.c_str() + v.size() || errno == ERANGE || x < min)
    throw gflow::invalid_argument(flag, "'" + v + "' is not a whole number >= " + std::to_string(min) + ".",
                                  "pass e.g. " + flag + " " + std::to_string(min > 0 ? min : 1) + ".");
  return x;
}

// ---- issue 23: replicas (kept apart from the loop below, which other flags extend) ---------------
// --verify-replicas N: gflow::verify_replicas every N steps (0: off, the default). Returns true
// when argv[i] was this flag (its value consumed).
bool parse_replica_option(options& o, int& i, int argc, const char* const* argv) {
  const std::string flag = argv[i];
  if (flag != "--verify-replicas") return false;
  if (i + 1 >= argc) throw gflow::invalid_argument(flag, "the option needs a value.", "write e.g. --verify-replicas 100 (0: off).");
  o.verify_replicas = parse_count(flag, argv[++i], 0);
  return true;
}

// ---- issue 25: checkpoints and restarts (kept apart like the replica option) ----------------------
bool parse_restart_option(options& o, int& i, int argc, const char* const* argv) {
  const std::string flag = argv[i];
  static const char* const mine[] = {"--checkpoint-every", "--checkpoint-dir", "--resume", "--timeout-ms", "--fault-rank", "--fault-at", "--save-params"};
  bool is_mine = false;
  for (const char* k : mine) is_mine = is_mine || flag == k;
  if (!is_mine) return false;
  if (i + 1 >= argc) throw gflow::invalid_argument(flag, "the option needs a value.", "write e.g. " + flag + " VALUE.");
  const std::string v = argv[++i];
  if (flag == "--checkpoint-every") o.checkpoint_every = parse_count(flag, v, 0);
  else if (flag == "--checkpoint-dir") o.checkpoint_dir = v;
  else if (flag == "--resume") o.resume = v;
  else if (flag == "--timeout-ms") o.timeout_ms = static_cast<std::int64_t>(parse_count(flag, v, 0));
  else if (flag == "--fault-rank") o.fault_rank = static_cast<int>(parse_count(flag, v, 0));
  else if (flag == "--fault-at") o.fault_at = parse_count(flag, v, 1);
  else o.save_params = v;
  if (flag == "--checkpoint-dir" || flag == "--resume" || flag == "--save-params")
    if (v.empty()) throw gflow::invalid_argument(flag, "the path is empty.", "pass a directory or file name.");
  return true;
}

}  // namespace

std::string usage(const std::string& program) {
  return "usage: mpiexec -n P " + program + " [options]\n"
         "  --data DIR             Fashion-MNIST IDX .gz files (default " + std::string(default_data_dir) + ")\n"
         "  --epochs N             passes over the training set (default 3)\n"
         "  --batch B              samples per rank per iteration (default 32)\n"
         "  --lr X                 learning rate, >= 0 (default 0.05)\n"
         "  --momentum M           SGD momentum in [0, 1) (default 0.9)\n"
         "  --weight-decay D       L2 on weight matrices (default 0)\n"
         "  --seed S               initialisation and shuffling seed (default 1)\n"
         "  --train-limit N        use the first N training samples (default all)\n"
         "  --warmup-iters N       sparse warm-up iterations (CSC dense + ramp, TopK densities; default half an epoch)\n"
         "  --loss-scale MODE      auto | none | dynamic | S (a constant); auto = dynamic on a 16-bit dense wire\n"
         "  --loss-scale-init S    initial dynamic scale (default 32768)\n"
         "  --loss-scale-window N  good steps before the scale doubles (default 500)\n"
         "  --lars C               LARS with coefficient C (e.g. 0.02 with --lr 0.1); default off\n"
         "  --rho R                elastic coupling (EASGD binaries; default 0.9 / (lr * P))\n"
         "  --csv FILE             per-epoch rows (rank 0)\n"
         "  --trace FILE           Chrome trace-event JSON of the exchanges, every rank (open in Perfetto; first ~260k events per rank)\n"
         "  --verify-replicas N    check every N steps that the ranks' parameters are bitwise equal (gflow::verify_replicas; default 0: off)\n"
         "  --checkpoint-every K   save a checkpoint set (exchanger state of every rank + the model) every K steps; default 0: off\n"
         "  --checkpoint-dir DIR   where the sets go, DIR/iter-<n>/ (default gflow-checkpoints)\n"
         "  --resume DIR           start from DIR's newest complete set; another number of ranks re-shards it (gflow::load_checkpoint)\n"
         "  --timeout-ms MS        the transport's timeout (default 10 min; 0: none)\n"
         "  --fault-rank R --fault-at N   (tests) rank R exits without MPI_Finalize before step N; the others report their timeout_error and leave (status 0)\n"
         "  --save-params FILE     rank 0 writes the final parameters (raw float32, pool order)\n"
         "  --check-acc A          exit 3 unless the final test accuracy (percent) >= A and the training loss fell\n"
         "  --help\n";
}

options parse_cli(int argc, const char* const* argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (parse_replica_option(o, i, argc, argv)) continue;
    if (parse_restart_option(o, i, argc, argv)) continue;
    static const char* const known[] = {"--data", "--epochs", "--batch", "--lr", "--momentum", "--weight-decay", "--seed", "--train-limit",
                                        "--warmup-iters", "--loss-scale", "--loss-scale-init", "--loss-scale-window", "--lars", "--rho",
                                        "--csv", "--check-acc", "--trace"};
    bool is_known = false;
    for (const char* k : known) is_known = is_known || flag == k;
    if (!is_known)
      throw gflow::invalid_argument(flag, "unknown option.", "run with --help for the list of options (flags take a separate value: --lr 0.05).");
    if (i + 1 >= argc) throw gflow::invalid_argument(flag, "the option needs a value.", "write e.g. " + flag + " VALUE.");
    const std::string v = argv[++i];
    if (flag == "--data") o.data_dir = v;
    else if (flag == "--epochs") o.epochs = static_cast<int>(parse_count(flag, v, 1));
    else if (flag == "--batch") o.batch = parse_count(flag, v, 1);
    else if (flag == "--seed") o.seed = parse_count(flag, v, 0);
    else if (flag == "--train-limit") o.train_limit = parse_count(flag, v, 1);
    else if (flag == "--warmup-iters") o.warmup_iters = static_cast<std::int64_t>(parse_count(flag, v, 0));
    else if (flag == "--loss-scale-window") o.loss_scale_window = static_cast<std::uint32_t>(parse_count(flag, v, 1));
    else if (flag == "--csv") o.csv = v;
    else if (flag == "--trace") o.trace = v;
    else if (flag == "--loss-scale") {
      if (v == "auto") o.loss_scale = loss_scale_mode::automatic;
      else if (v == "none") o.loss_scale = loss_scale_mode::none;
      else if (v == "dynamic") o.loss_scale = loss_scale_mode::dynamic;
      else {
        const double s = parse_number(flag, v);
        if (!(s > 0)) throw gflow::invalid_argument(flag, "a constant loss scale must be positive (got " + v + ").", "pass e.g. --loss-scale 1024, or auto.");
        o.loss_scale = loss_scale_mode::fixed;
        o.loss_scale_value = static_cast<float>(s);
      }
    } else {
      const double x = parse_number(flag, v);
      if (flag == "--lr") {
        if (x < 0) throw gflow::invalid_argument(flag, "the learning rate must be non-negative (got " + v + ").", "pass e.g. --lr 0.05.");
        o.lr = static_cast<float>(x);
      } else if (flag == "--momentum") {
        if (x < 0 || x >= 1)
          throw gflow::invalid_argument(flag, "the momentum must lie in [0, 1) (got " + v + "); 1 or more makes the velocity grow without bound.",
                                        "pass e.g. --momentum 0.9.");
        o.momentum = static_cast<float>(x);
      } else if (flag == "--weight-decay") {
        if (x < 0) throw gflow::invalid_argument(flag, "the weight decay must be non-negative (got " + v + ").", "pass e.g. --weight-decay 0.0005.");
        o.weight_decay = static_cast<float>(x);
      } else if (flag == "--loss-scale-init") {
        if (!(x > 0)) throw gflow::invalid_argument(flag, "the initial loss scale must be positive (got " + v + ").", "pass e.g. 32768.");
        o.loss_scale_value = static_cast<float>(x);
      } else if (flag == "--lars") {
        if (!(x > 0)) throw gflow::invalid_argument(flag, "the LARS coefficient must be positive (got " + v + ").", "pass e.g. --lars 0.02, or leave LARS off.");
        o.lars = static_cast<float>(x);
      } else if (flag == "--rho") {
        if (!(x > 0)) throw gflow::invalid_argument(flag, "the elastic coupling must be positive (got " + v + ").", "pass e.g. --rho 4, or leave the default.");
        o.rho = static_cast<float>(x);
      } else if (flag == "--check-acc") {
        if (x < 0 || x > 100) throw gflow::invalid_argument(flag, "the accuracy floor is a percentage in [0, 100] (got " + v + ").", "pass e.g. --check-acc 70.");
        o.check_acc = x;
      }
    }
  }
  return o;
}

}  // namespace trainer
