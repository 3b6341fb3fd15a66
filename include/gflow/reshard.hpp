#pragma once
// Checkpoint files and re-sharding loads: what a trainer calls to survive a lost rank
// (docs/GUIDE.md, "Restarting on another number of ranks"; docs/DESIGN.md, "Re-sharding checkpoints").
//
//   gflow::save_checkpoint(ex, "ckpt");        // every rank, between iterations: ckpt/iter-<n>/rank-<r>.gflow
//   ...a rank is lost; the job restarts on P' ranks...
//   std::uint64_t it = gflow::load_checkpoint(ex, "ckpt");   // newest complete set; re-shards if P' != P
//
// Files are written atomically: to `<file>.tmp` in the same directory, flushed and closed, then
// renamed over `<file>`, so a reader sees the old file or the whole new one, never a part. A set
// is complete when every rank of the job that saved it has its file; a rank that died while the
// others wrote leaves an incomplete newest set, which load_checkpoint passes over.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "error.hpp"
#include "detail/support/checkpoint.hpp"
#include "detail/support/fingerprint.hpp"
#include "detail/support/reshard.hpp"

namespace gflow {

/// What a re-shard needs besides the checkpoints: average (the default, as exchange_options::average)
/// scales residuals by P'/P; false only adds them.
using reshard_options = detail::reshard_options;

/// Rewrites the checkpoints of a job of P ranks (`old`: one stream per rank, any order, each
/// positioned at the start of a checkpoint) as rank new_rank's checkpoint of a job of new_size
/// ranks, written to `out`; load it with load_state. Everything is read and validated first:
/// a truncated or corrupt checkpoint raises parse_error; a missing or duplicate rank, or ranks of
/// jobs of different sizes, invalid_argument; checkpoints of different iterations (mixed
/// generations) or of different exchangers mismatch_error. Nothing is written then.
inline void reshard_checkpoint(std::span<std::istream* const> old, int new_rank, int new_size, std::ostream& out, reshard_options opt = {}) {
  detail::check_new_shape(new_rank, new_size);
  const std::vector<detail::checkpoint_image> imgs = detail::read_set(old);
  const auto set = detail::order_set(imgs);
  detail::write_resharded(set, static_cast<std::uint32_t>(new_rank), static_cast<std::uint32_t>(new_size), opt, out);
}

/// The whole new set at once: new_size checkpoints, out[r'] for new rank r' (the tool's path).
inline std::vector<std::string> reshard_checkpoints(std::span<std::istream* const> old, int new_size, reshard_options opt = {}) {
  detail::check_new_shape(0, new_size);
  const std::vector<detail::checkpoint_image> imgs = detail::read_set(old);
  const auto set = detail::order_set(imgs);
  std::vector<std::string> out;
  for (int r = 0; r < new_size; ++r) {
    std::ostringstream os(std::ios::binary);
    detail::write_resharded(set, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(new_size), opt, os);
    out.push_back(os.str());
  }
  return out;
}


/// Loads this rank's share of the checkpoints of a job of P ranks (`old`: one stream per old
/// rank, any order) into `ex`, a rank of a job of P' ranks (its transport's rank and size; P' may
/// equal P). The share rule (support/reshard.hpp): old rank r's residual goes to new rank
/// r mod P', summed there and scaled by P'/P when ex averages, so sum over ranks / ranks is kept
/// element by element; shared state (iteration, schedules, warm-up position, selections) carries
/// over; with P' != P a Fusion<Auto> tuner settles again. Every stream is read and validated
/// before anything is applied: another layout or composition raises load_state's
/// mismatch_error, a bad set the errors of reshard_checkpoint; ex is then unchanged.
template <class Ex>
void load_resharded(Ex& ex, std::span<std::istream* const> old) {
  const int rank = ex.transport().rank(), size = ex.transport().size();
  const detail::checkpoint_identity mine =
      detail::make_checkpoint_identity<typename Ex::policies>(ex.layout(), rank, size, ex.pool_size());
  const std::vector<detail::checkpoint_image> imgs = detail::read_set(old, &mine, &ex.layout());
  const auto set = detail::order_set(imgs);
  std::stringstream buf(std::ios::in | std::ios::out | std::ios::binary);
  detail::write_resharded(set, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(size), {ex.options().average}, buf);
  ex.load_state(buf);
}

namespace detail {
inline std::vector<std::unique_ptr<std::ifstream>> open_all(const std::vector<std::filesystem::path>& files) {
  std::vector<std::unique_ptr<std::ifstream>> in;
  for (const auto& f : files) {
    in.push_back(std::make_unique<std::ifstream>(f, std::ios::binary));
    if (!*in.back())
      throw invalid_argument("checkpoints", "the checkpoint file '" + f.string() + "' cannot be opened.",
                             "pass the files every rank of the saving job wrote (check the path and permissions).");
  }
  return in;
}
inline std::vector<std::istream*> pointers(const std::vector<std::unique_ptr<std::ifstream>>& in) {
  std::vector<std::istream*> p;
  for (const auto& s : in) p.push_back(s.get());
  return p;
}
}  // namespace detail

/// load_resharded from files (one per old rank, any order).
template <class Ex>
void load_resharded(Ex& ex, const std::vector<std::filesystem::path>& files) {
  const auto in = detail::open_all(files);
  const auto p = detail::pointers(in);
  load_resharded(ex, std::span<std::istream* const>(p));
}

/// Writes `bytes` to `file` atomically: `<file>.tmp`, flushed and closed, renamed over `file`.
inline void write_file_atomically(const std::filesystem::path& file, const std::string& bytes) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out)
      throw invalid_argument("file", fmt::format("writing the checkpoint to '{}' failed ({} bytes).", tmp.string(), bytes.size()),
                             "check the directory exists, is writable and has space.");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec)
    throw invalid_argument("file", "renaming '" + tmp.string() + "' to '" + file.string() + "' failed: " + ec.message() + ".",
                           "write checkpoints to a local or POSIX file system where rename replaces the target atomically.");
}

/// The file of `rank` in a checkpoint set directory.
inline std::filesystem::path checkpoint_file(const std::filesystem::path& set_dir, int rank) {
  return set_dir / fmt::format("rank-{}.gflow", rank);
}
/// The set directory of the checkpoint saved after `iteration` iterations under `root`.
inline std::filesystem::path checkpoint_set_dir(const std::filesystem::path& root, std::uint64_t iteration) {
  return root / fmt::format("iter-{:012}", iteration);  // zero-padded: sorts by name
}

/// Saves this rank's state (save_state) to checkpoint_file(checkpoint_set_dir(root, iteration), rank),
/// atomically; every rank calls it between the same iterations. Returns the file written.
template <class Ex>
std::filesystem::path save_checkpoint(const Ex& ex, const std::filesystem::path& root) {
  std::ostringstream os(std::ios::binary);
  ex.save_state(os);
  const std::filesystem::path dir = checkpoint_set_dir(root, ex.iteration());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw invalid_argument("root", "the checkpoint directory '" + dir.string() + "' cannot be created: " + ec.message() + ".",
                           "pass a writable directory.");
  const std::filesystem::path f = checkpoint_file(dir, ex.transport().rank());
  write_file_atomically(f, os.str());
  return f;
}

/// The newest complete set under `root`: its rank files in rank order; empty when there is none.
/// A set directory iter-<n> is complete when it holds rank-0 .. rank-(P-1) for the P named in its
/// rank-0 file's header (a corrupt rank-0 file raises its parse_error).
inline std::vector<std::filesystem::path> newest_checkpoint_set(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().starts_with("iter-")) dirs.push_back(e.path());
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& d : dirs) {
    std::ifstream in(checkpoint_file(d, 0), std::ios::binary);
    if (!in) continue;
    detail::checkpoint_reader r(in);
    const detail::checkpoint_identity id = detail::read_checkpoint_identity(r, std::size_t{1} << 24);
    std::vector<std::filesystem::path> files;
    for (std::uint32_t k = 0; k < id.size; ++k) {
      files.push_back(checkpoint_file(d, static_cast<int>(k)));
      if (!std::filesystem::exists(files.back())) break;
    }
    if (files.size() == id.size && std::filesystem::exists(files.back())) return files;
  }
  return {};
}

/// Loads the newest complete set under `root` into `ex`: load_state of this rank's own file when
/// the job has the saving job's size, load_resharded otherwise. Returns the iteration it resumes
/// at; throws invalid_argument("root") when `root` holds no complete set.
template <class Ex>
std::uint64_t load_checkpoint(Ex& ex, const std::filesystem::path& root) {
  const std::vector<std::filesystem::path> files = newest_checkpoint_set(root);
  if (files.empty())
    throw invalid_argument("root", "'" + root.string() + "' holds no complete checkpoint set (iter-<n>/rank-<r>.gflow for every rank r).",
                           "pass the directory save_checkpoint wrote to, or start without resuming.");
  const int rank = ex.transport().rank();
  if (files.size() == static_cast<std::size_t>(ex.transport().size())) {
    std::ifstream in(files[static_cast<std::size_t>(rank)], std::ios::binary);
    ex.load_state(in);
  } else {
    load_resharded(ex, files);
  }
  return ex.iteration();
}

}  // namespace gflow
