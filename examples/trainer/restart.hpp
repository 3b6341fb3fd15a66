#pragma once
// Checkpoints and restarts of the MLP trainer (issue 25): --checkpoint-every K saves a set
// (every rank's exchanger state through gflow::save_checkpoint, and rank 0's model file:
// parameters, SGD velocity, loss scale; identical on every rank, so one copy serves any job size);
// --resume DIR loads the newest complete set, re-sharded by gflow::load_checkpoint when the job
// size differs, and prints what the re-shard conserved. --fault-rank / --fault-at make a rank
// exit without MPI_Finalize (the restart tests); the survivors report their timeout_error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gflow/optim/loss_scale.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/reshard.hpp>

#include "trainer.hpp"

namespace trainer {

inline constexpr const char* model_file_name = "trainer-model.bin";

/// Rank 0 writes the model file of the set saved after `iteration` steps (before any rank's
/// exchanger file: a set whose rank-0 file exists has its model file), then every rank its own.
template <class Ex>
void save_training_checkpoint(const Ex& ex, const options& o, std::span<const float> w, const gflow::optim::momentum_sgd& opt,
                              const gflow::optim::dynamic_loss_scale& scaler) {
  const std::filesystem::path dir = gflow::checkpoint_set_dir(o.checkpoint_dir, ex.iteration());
  if (ex.transport().rank() == 0) {
    std::filesystem::create_directories(dir);
    std::ostringstream os(std::ios::binary);
    gflow::detail::checkpoint_writer wr(os);
    wr.bytes("GFTRAINR", 8);
    wr.u64(ex.iteration());
    wr.array(w.data(), w.size());
    wr.array(opt.velocity().data(), opt.velocity().size());
    wr.f32(scaler.scale());
    wr.u32(scaler.good_steps());
    wr.u64(scaler.skipped());
    wr.checksum();
    gflow::write_file_atomically(dir / model_file_name, os.str());
  }
  ex.transport().barrier();  // the model file exists before any exchanger file of the set
  (void)gflow::save_checkpoint(ex, o.checkpoint_dir);
  if (ex.transport().rank() == 0) {
    std::printf("CHECKPOINT iteration=%llu dir=%s\n", static_cast<unsigned long long>(ex.iteration()), dir.string().c_str());
    std::fflush(stdout);
  }
}

/// Loads DIR's newest complete set (re-sharded when the size differs) and the model file; returns
/// the step to continue from. Prints a RESHARD line (rank 0) with what the re-shard conserved.
template <class Ex>
std::uint64_t resume_training(Ex& ex, const options& o, std::span<float> w, gflow::optim::momentum_sgd& opt, gflow::optim::dynamic_loss_scale& scaler) {
  const auto files = gflow::newest_checkpoint_set(o.resume);
  if (files.empty())
    throw gflow::invalid_argument("--resume", "'" + o.resume + "' holds no complete checkpoint set.", "pass the --checkpoint-dir of an earlier run.");
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
  const std::uint64_t start = gflow::load_checkpoint(ex, o.resume);
  // The model file of the same set.
  std::ifstream mf(files[0].parent_path() / model_file_name, std::ios::binary);
  if (!mf) throw gflow::invalid_argument("--resume", "the set " + files[0].parent_path().string() + " has no " + model_file_name + ".", "pass a directory this trainer wrote.");
  gflow::detail::checkpoint_reader rd(mf);
  char magic[8];
  rd.bytes(magic, 8, "the model file's magic");
  if (std::string(magic, 8) != "GFTRAINR") rd.fail("model", "the model file does not start with GFTRAINR.");
  if (rd.u64("the model file's iteration") != start) rd.fail("model", "the model file belongs to another iteration than the exchanger files.");
  std::vector<float> wv, vel;
  rd.array_exact(wv, w.size(), "the parameters");
  rd.array_exact(vel, opt.velocity().size(), "the velocity");
  const float scale = rd.f32("the loss scale");
  const std::uint32_t good = rd.u32("the loss scale's good steps");
  const std::uint64_t skipped = rd.u64("the skipped steps");
  rd.verify_checksum("model file");
  std::copy(wv.begin(), wv.end(), w.begin());
  std::copy(vel.begin(), vel.end(), opt.velocity().begin());
  scaler.restore(scale, good, skipped);
  if constexpr (has_residual) {
    if (P != Pn) {
      // sum' / P' == sum / P, element by element: P * sum' vs P' * sum, both in double. The new
      // ranks' values are each rounded to float once, so "within" allows one float rounding per
      // new rank; "exact" counts the elements where the two are equal bit for bit.
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
  if (ex.transport().rank() == 0) {
    std::printf("RESUMED iteration=%llu from=%s ranks=%d (saved by %d)\n", static_cast<unsigned long long>(start),
                files[0].parent_path().string().c_str(), Pn, P);
    std::fflush(stdout);
  }
  return start;
}

}  // namespace trainer
