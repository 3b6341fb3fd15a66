#pragma once
// Checkpoints and restarts of the trainers (issue 25), shared by the MLP trainer and the libtorch
// CNN trainer (examples/torch): --checkpoint-every K saves a set (every rank's exchanger state
// through gflow::save_checkpoint, and the trainer's model file: parameters, optimizer velocity,
// loss scale); --resume DIR loads the newest complete set, re-sharded by gflow::load_checkpoint
// when the job size differs, and prints what the re-shard conserved. --fault-rank / --fault-at
// make a rank exit without MPI_Finalize (the restart tests); the survivors report their
// timeout_error.
// layering: gflow::detail::read_set (support/reshard.hpp): --resume on another size sums the old
// set's residuals itself to print what the re-shard conserved (the RESHARD line the restart tests check).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/optim/loss_scale.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/reshard.hpp>

#include "trainer.hpp"

namespace trainer {

inline constexpr const char* model_file_name = "trainer-model.bin";

/// --fault-rank R --fault-at N: rank R leaves before step N, without MPI_Finalize. Status 0:
/// Open MPI (orte_allowed_exit_without_sync) then lets the others run on to their timeout.
inline void fault_point(const options& o, int rank, std::uint64_t done) {
  if (o.fault_rank != rank || done != o.fault_at) return;
  std::printf("FAULT rank=%d exits before step %llu\n", o.fault_rank, static_cast<unsigned long long>(done));
  std::fflush(stdout);
  std::_Exit(0);
}

/// Runs fn() (a step's collectives); a timeout_error (a lost rank) is printed as
/// TIMEOUT rank= step= detected_ms= subject= what=; under --fault-rank the survivor then leaves with
/// status 0, so that every survivor reports (a non-zero status or MPI_Abort would end the others first).
template <class Fn>
auto report_timeouts(const options& o, int rank, std::uint64_t done, Fn&& fn) -> decltype(fn()) {
  const auto begin = std::chrono::steady_clock::now();
  try {
    return fn();
  } catch (const gflow::timeout_error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - begin).count();
    std::printf("TIMEOUT rank=%d step=%llu detected_ms=%lld subject=%s what=%s\n", rank, static_cast<unsigned long long>(done),
                static_cast<long long>(ms), e.subject().c_str(), e.what());
    std::fflush(stdout);
    if (o.fault_rank >= 0) std::_Exit(0);
    throw;
  }
}

/// A model file: an 8-byte magic and the iteration, then the trainer's arrays (checksummed by
/// gflow's checkpoint writer), written through a temporary file and a rename.
inline void write_model_file(const std::filesystem::path& file, const char (&magic)[9], std::uint64_t iteration,
                             const std::function<void(gflow::checkpoint_writer&)>& body) {
  std::ostringstream os(std::ios::binary);
  gflow::checkpoint_writer w(os);
  w.bytes(magic, 8);
  w.u64(iteration);
  body(w);
  w.checksum();
  gflow::write_file_atomically(file, os.str());
}

/// Reads a model file written by write_model_file for `iteration`; body reads the arrays.
inline void read_model_file(const std::filesystem::path& file, const char (&magic)[9], std::uint64_t iteration,
                            const std::function<void(gflow::checkpoint_reader&)>& body) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw gflow::invalid_argument("--resume", "the set has no model file '" + file.string() + "'.", "pass a directory this trainer wrote.");
  gflow::checkpoint_reader r(in);
  char m[8];
  r.bytes(m, 8, "the model file's magic");
  if (std::string(m, 8) != std::string(magic, 8)) r.fail("model", "'" + file.string() + "' does not start with " + std::string(magic, 8) + ".");
  if (r.u64("the model file's iteration") != iteration) r.fail("model", "the model file belongs to another iteration than the exchanger files.");
  body(r);
  r.verify_checksum("model file");
}

/// Where a resume came from: the step to continue from, the set's directory, the saving job's size.
struct resumed_set {
  std::uint64_t start = 0;
  std::filesystem::path dir;
  int saved_ranks = 0;
};

/// Loads DIR's newest complete set into ex (gflow::load_checkpoint: re-sharded when the job size
/// differs). On a re-shard of a sparsifier with a residual, rank 0 prints
///   RESHARD from=P to=P' iteration=N elements= nonzero= exact= within_rounding=
/// comparing sum' / P' with sum / P element by element (P * sum' vs P' * sum, both in double):
/// "exact" counts the elements equal bit for bit, "within_rounding" those within one float
/// rounding per new rank (each new rank's share is rounded to float once).
template <class Ex>
resumed_set resume_exchange(Ex& ex, const std::string& root) {
  const auto files = gflow::newest_checkpoint_set(root);
  if (files.empty())
    throw gflow::invalid_argument("--resume", "'" + root + "' holds no complete checkpoint set.", "pass the --checkpoint-dir of an earlier run.");
  const int P = static_cast<int>(files.size()), Pn = ex.transport().size();
  std::vector<double> old_sum;  // the old residuals summed over ranks (exact in double for a few ranks)
  constexpr bool has_residual = requires { ex.sparsifier().residual(); };
  if (P != Pn && has_residual) {
    const auto in = gflow::detail::open_all(files);
    const auto imgs = gflow::detail::read_set(gflow::detail::pointers(in));
    old_sum.assign(imgs.at(0).residual.size(), 0.0);
    for (const auto& im : imgs)
      for (std::size_t i = 0; i < im.residual.size(); ++i) old_sum[i] += im.residual[i];
  }
  const std::uint64_t start = gflow::load_checkpoint(ex, root);
  if constexpr (has_residual) {
    if (P != Pn) {
      const auto res = ex.sparsifier().residual();
      std::vector<double> now(res.begin(), res.end()), mag(res.size());
      for (std::size_t i = 0; i < res.size(); ++i) mag[i] = std::fabs(static_cast<double>(res[i]));
      sum_over_ranks(now.data(), static_cast<int>(now.size()), ex.transport().comm());
      sum_over_ranks(mag.data(), static_cast<int>(mag.size()), ex.transport().comm());
      std::size_t exact = 0, within = 0, nonzero = 0;
      for (std::size_t i = 0; i < now.size(); ++i) {
        const double a = now[i] * P, b = old_sum[i] * Pn;
        if (old_sum[i] != 0.0) ++nonzero;
        if (a == b) ++exact;
        if (std::fabs(a - b) <= std::ldexp(mag[i] * P, -24) + 1e-300) ++within;
      }
      if (ex.transport().rank() == 0) {
        std::printf("RESHARD from=%d to=%d iteration=%llu elements=%zu nonzero=%zu exact=%zu within_rounding=%zu\n", P, Pn,
                    static_cast<unsigned long long>(start), now.size(), nonzero, exact, within);
        std::fflush(stdout);
      }
    }
  }
  return {start, files[0].parent_path(), P};
}

/// Rank 0 prints where training resumes.
inline void print_resumed(const resumed_set& s, int rank, int ranks) {
  if (rank != 0) return;
  std::printf("RESUMED iteration=%llu from=%s ranks=%d (saved by %d)\n", static_cast<unsigned long long>(s.start), s.dir.string().c_str(), ranks,
              s.saved_ranks);
  std::fflush(stdout);
}

/// Rank 0 prints a saved set.
inline void print_checkpoint(const std::filesystem::path& dir, std::uint64_t iteration, int rank) {
  if (rank != 0) return;
  std::printf("CHECKPOINT iteration=%llu dir=%s\n", static_cast<unsigned long long>(iteration), dir.string().c_str());
  std::fflush(stdout);
}

/// --save-params FILE: rank 0 writes the final parameters (raw float32), for the restart tests' bitwise comparison.
inline void save_params(const options& o, int rank, std::span<const float> w) {
  if (o.save_params.empty() || rank != 0) return;
  std::ofstream f(o.save_params, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
  if (!f) throw gflow::invalid_argument("--save-params", "writing '" + o.save_params + "' failed.", "pass a writable path.");
}

// ---- the MLP trainer's model file --------------------------------------------------------------

/// Rank 0 writes the model file of the set saved after `iteration` steps (before any rank's
/// exchanger file: a set whose rank-0 file exists has its model file), then every rank its own.
template <class Ex>
void save_training_checkpoint(const Ex& ex, const options& o, std::span<const float> w, const gflow::optim::momentum_sgd& opt,
                              const gflow::optim::dynamic_loss_scale& scaler) {
  const std::filesystem::path dir = gflow::checkpoint_set_dir(o.checkpoint_dir, ex.iteration());
  if (ex.transport().rank() == 0) {
    std::filesystem::create_directories(dir);
    write_model_file(dir / model_file_name, "GFTRAINR", ex.iteration(), [&](gflow::checkpoint_writer& wr) {
      wr.array(w.data(), w.size());
      wr.array(opt.velocity().data(), opt.velocity().size());
      wr.f32(scaler.scale());
      wr.u32(scaler.good_steps());
      wr.u64(scaler.skipped());
    });
  }
  ex.transport().barrier();  // the model file exists before any exchanger file of the set
  (void)gflow::save_checkpoint(ex, o.checkpoint_dir);
  print_checkpoint(dir, ex.iteration(), ex.transport().rank());
}

/// Loads DIR's newest complete set (re-sharded when the size differs) and the model file; returns
/// the step to continue from.
template <class Ex>
std::uint64_t resume_training(Ex& ex, const options& o, std::span<float> w, gflow::optim::momentum_sgd& opt, gflow::optim::dynamic_loss_scale& scaler) {
  const resumed_set s = resume_exchange(ex, o.resume);
  std::vector<float> wv, vel;
  float scale = 0;
  std::uint32_t good = 0;
  std::uint64_t skipped = 0;
  read_model_file(s.dir / model_file_name, "GFTRAINR", s.start, [&](gflow::checkpoint_reader& rd) {
    rd.array_exact(wv, w.size(), "the parameters");
    rd.array_exact(vel, opt.velocity().size(), "the velocity");
    scale = rd.f32("the loss scale");
    good = rd.u32("the loss scale's good steps");
    skipped = rd.u64("the skipped steps");
  });
  std::copy(wv.begin(), wv.end(), w.begin());
  std::copy(vel.begin(), vel.end(), opt.velocity().begin());
  scaler.restore(scale, good, skipped);
  print_resumed(s, ex.transport().rank(), ex.transport().size());
  return s.start;
}

}  // namespace trainer
