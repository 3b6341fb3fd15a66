#pragma once
// Checkpoint files and re-sharding loads: what a trainer calls to survive a lost rank
// (docs/GUIDE.md, "Restarting on another number of ranks"; docs/DESIGN.md, "Re-sharding checkpoints").
//
//   gflow::save_checkpoint(ex, "ckpt");        // every rank, between iterations: ckpt/iter-<n>/rank-<r>.gflow
//   ...a rank is lost; the job restarts on P' ranks...
//   std::uint64_t it = gflow::load_checkpoint(ex, "ckpt");   // newest complete set; re-shards if P' != P
//
// With Sharding<ReduceScatter>, the state a trainer keeps for its shard goes with it:
//   gflow::save_checkpoint(ex, "ckpt", {momentum});             // + shard-<r>.gflow
//   gflow::load_checkpoint(ex, "ckpt", state);                  // state[0]: momentum over the new shard
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
#include "detail/exchanger/shard_state.hpp"
#include "pool.hpp"

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


/// What reshard_checkpoints writes with shard state: new rank r's checkpoint (rank-<r>.gflow) and
/// its shard state file (shard-<r>.gflow).
struct resharded_set {
  std::vector<std::string> checkpoints;
  std::vector<std::string> shard_states;
};

/// reshard_checkpoints, with the state a trainer keeps for its shard (Sharding<ReduceScatter>:
/// the shard-<r>.gflow files save_checkpoint(ex, root, state) writes; one stream per old rank, any
/// order). The new shard files hold the old state regrouped (each pool element in the file of new
/// rank r mod P' of the lowest old rank r whose shard held it; docs/DESIGN.md, "Re-sharding
/// checkpoints"), so load_checkpoint(ex, root, state) on P' ranks takes each element of its new
/// shard from them, whatever the new job's buckets and topology. Both sets are read and validated
/// first: shard files of another job, iteration or size than the checkpoints, a missing or
/// duplicate rank, or shards that do not cover the pool raise a typed error, and nothing is
/// written.
inline resharded_set reshard_checkpoints(std::span<std::istream* const> old, std::span<std::istream* const> old_shard_states, int new_size,
                                         reshard_options opt = {}) {
  detail::check_new_shape(0, new_size);
  const std::vector<detail::checkpoint_image> imgs = detail::read_set(old);
  const auto set = detail::order_set(imgs);
  std::vector<detail::shard_image> shard_imgs;
  for (std::size_t i = 0; i < old_shard_states.size(); ++i) {
    try {
      shard_imgs.push_back(detail::read_shard_image(*old_shard_states[i]));
    } catch (const parse_error& e) {
      throw parse_error("shard_states", fmt::format("shard state file {} of the set cannot be read: {}", i, e.what()),
                        "pass intact shard files, every one written completely by save_checkpoint.");
    }
  }
  const auto shards = detail::order_shard_set(shard_imgs);
  const detail::checkpoint_identity &c = set[0]->id, &s = shards[0]->id;
  if (s.composition != c.composition || s.layout_fp != c.layout_fp || s.tensor_fps != c.tensor_fps || s.pool_elems != c.pool_elems)
    throw mismatch_error("shard_states", fmt::format("the shard state files were saved by another exchanger (<{}>) than the checkpoints (<{}>), or over another layout.",
                                                     s.composition, c.composition),
                         "pass the rank-<r>.gflow and shard-<r>.gflow files of one save of one job.");
  if (shards.size() != set.size())
    throw invalid_argument("shard_states", fmt::format("the shard state files are of a job of {} ranks; the checkpoints of one of {}.", shards.size(), set.size()),
                           "pass the rank-<r>.gflow and shard-<r>.gflow files of one save of one job.");
  if (shards[0]->iteration != set[0]->iteration)
    throw mismatch_error("iteration", fmt::format("the shard state files are of iteration {}; the checkpoints of iteration {}.", shards[0]->iteration, set[0]->iteration),
                         "pass the rank-<r>.gflow and shard-<r>.gflow files of one save (one iter-<n> directory).");
  resharded_set out;
  for (int r = 0; r < new_size; ++r) {
    std::ostringstream os(std::ios::binary), ss(std::ios::binary);
    detail::write_resharded(set, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(new_size), opt, os);
    detail::write_resharded_shards(shards, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(new_size), ss);
    out.checkpoints.push_back(os.str());
    out.shard_states.push_back(ss.str());
  }
  return out;
}

/// Whether a stream positioned at a gflow file's start holds a trainer's shard state
/// (shard-<r>.gflow) rather than an exchanger's checkpoint; reads its header and first tag
/// (a foreign or truncated stream raises parse_error).
inline bool is_shard_state(std::istream& in) {
  detail::checkpoint_reader r(in);
  (void)detail::read_checkpoint_identity(r, std::size_t{1} << 24);
  return r.u32("the first section's tag") == detail::section_tag("SHRD");
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
  detail::reshard_options opt;  // named, not a braced argument: nvcc's host pass (CUDA 13, g++ 12) refuses {bool} there
  opt.average = ex.options().average;
  detail::write_resharded(set, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(size), opt, buf);
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

namespace detail {
inline std::vector<std::filesystem::path> newest_or_throw(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> files = newest_checkpoint_set(root);
  if (files.empty())
    throw invalid_argument("root", "'" + root.string() + "' holds no complete checkpoint set (iter-<n>/rank-<r>.gflow for every rank r).",
                           "pass the directory save_checkpoint wrote to, or start without resuming.");
  return files;
}
template <class Ex>
std::uint64_t load_set(Ex& ex, const std::vector<std::filesystem::path>& files) {
  const int rank = ex.transport().rank();
  if (files.size() == static_cast<std::size_t>(ex.transport().size())) {
    std::ifstream in(files[static_cast<std::size_t>(rank)], std::ios::binary);
    ex.load_state(in);
  } else {
    load_resharded(ex, files);
  }
  return ex.iteration();
}
}  // namespace detail

/// Loads the newest complete set under `root` into `ex`: load_state of this rank's own file when
/// the job has the saving job's size, load_resharded otherwise. Returns the iteration it resumes
/// at; throws invalid_argument("root") when `root` holds no complete set.
template <class Ex>
std::uint64_t load_checkpoint(Ex& ex, const std::filesystem::path& root) {
  return detail::load_set(ex, detail::newest_or_throw(root));
}

// ---- Sharding<ReduceScatter>: the trainer's per-shard state -------------------------------------

/// The file of `rank`'s shard state in a checkpoint set directory.
inline std::filesystem::path shard_state_file(const std::filesystem::path& set_dir, int rank) {
  return set_dir / fmt::format("shard-{}.gflow", rank);
}

/// save_checkpoint, with the state a trainer keeps for its shard (`shard_state`: arrays such as
/// momentum or Adam's moments, each packed over ex.shard(), its ranges back to back). Writes
/// shard-<r>.gflow (the shard's ranges and the arrays) before rank-<r>.gflow, so a complete set of
/// rank files has every shard file. Every rank, between the same iterations.
template <class Ex>
  requires requires(const Ex& e) { e.shard(); }
std::filesystem::path save_checkpoint(const Ex& ex, const std::filesystem::path& root, const std::vector<std::span<const float>>& shard_state) {
  const auto mine = detail::shard_pieces(ex.shard());
  std::size_t elems = 0;
  for (const pool_range& r : mine) elems += r.size();
  for (std::size_t a = 0; a < shard_state.size(); ++a)
    if (shard_state[a].size() != elems)
      throw invalid_argument("shard_state", fmt::format("shard state array {} has {} values; this rank's shard holds {}.", a, shard_state[a].size(), elems),
                             "pass each array packed over ex.shard() (its ranges back to back), as move_shard_state takes it.");
  const int rank = ex.transport().rank(), size = ex.transport().size();
  std::ostringstream os(std::ios::binary);
  detail::write_shard_state(os, detail::make_checkpoint_identity<typename Ex::policies>(ex.layout(), rank, size, ex.pool_size()), ex.iteration(),
                            detail::pool_order_fingerprint(ex.pool_plan().offset), mine, shard_state);
  const std::filesystem::path dir = checkpoint_set_dir(root, ex.iteration());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw invalid_argument("root", "the checkpoint directory '" + dir.string() + "' cannot be created: " + ec.message() + ".", "pass a writable directory.");
  write_file_atomically(shard_state_file(dir, rank), os.str());
  return save_checkpoint(ex, root);
}

namespace detail {
template <class Ex>
std::uint64_t load_shard_states(Ex& ex, const std::vector<std::filesystem::path>& files, std::uint64_t it, std::vector<std::vector<float>>& shard_state) {
  const int rank = ex.transport().rank(), old_size = static_cast<int>(files.size());
  const detail::checkpoint_identity id = detail::make_checkpoint_identity<typename Ex::policies>(ex.layout(), rank, ex.transport().size(), ex.pool_size());
  const std::uint64_t order = detail::pool_order_fingerprint(ex.pool_plan().offset);
  const auto mine = detail::shard_pieces(ex.shard());
  std::size_t elems = 0;
  for (const pool_range& r : mine) elems += r.size();
  std::vector<char> filled(elems, 0);
  std::size_t left = elems;
  std::vector<std::vector<float>> out;
  std::size_t arrays = 0;
  std::vector<int> order_of_reads;
  if (rank < old_size) order_of_reads.push_back(rank);
  for (int k = 0; k < old_size; ++k)
    if (k != rank) order_of_reads.push_back(k);
  bool counted = false;  // the array count is known (from the first file that holds any range)
  int count_from = 0;
  for (int k : order_of_reads) {
    if (left == 0 && counted) break;
    const std::filesystem::path f = gflow::shard_state_file(files[static_cast<std::size_t>(k)].parent_path(), k);
    std::ifstream in(f, std::ios::binary);
    if (!in)
      throw invalid_argument("root", "the checkpoint set has no shard state file '" + f.string() + "'.",
                             "load with load_checkpoint(ex, root) when the set was saved without shard state, or pass the set that save_checkpoint(ex, root, state) wrote.");
    detail::shard_state_file s(in, id, ex.layout(), std::size_t{1} << 10);
    if (s.identity().rank != static_cast<std::uint32_t>(k) || s.identity().size != static_cast<std::uint32_t>(old_size))
      throw mismatch_error("shard_state", fmt::format("'{}' was written by rank {} of {}; the set is of {} ranks.", f.string(), s.identity().rank, s.identity().size, old_size),
                           "load a set whose files all come from one save of one job.");
    if (s.iteration() != it)
      throw mismatch_error("shard_state", fmt::format("'{}' holds the state of iteration {}; the exchanger's checkpoint is of iteration {}.", f.string(), s.iteration(), it),
                           "load a set whose files all come from one save (mixed generations cannot be resumed from).");
    if (s.order_fingerprint() != order)
      throw mismatch_error("shard_state", fmt::format("'{}' was saved over another pool order than the one its set's checkpoint restored.", f.string()),
                           "load a set whose files all come from one save of one job.");
    if (s.ranges().empty()) continue;  // a rank whose shard was empty: its array count says nothing
    if (!counted) {
      arrays = s.arrays();
      out.assign(arrays, std::vector<float>(elems, 0.0f));
      counted = true;
      count_from = k;
    } else if (s.arrays() != arrays) {
      throw mismatch_error("shard_state", fmt::format("'{}' holds {} arrays; rank {}'s file holds {}.", f.string(), s.arrays(), count_from, arrays),
                           "load a set whose files all come from one save of one job.");
    }
    const auto runs = detail::take_from(s.ranges(), mine, filled);
    if (runs.empty()) continue;  // nothing of this rank's shard: its arrays are not read
    for (std::size_t a = 0; a < arrays; ++a) {
      const std::vector<float> v = s.next_array();
      for (const auto& run : runs) std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(run.src), run.n, out[a].begin() + static_cast<std::ptrdiff_t>(run.dst));
    }
    s.finish();
    for (const auto& run : runs) left -= run.n;
  }
  if (left != 0)
    throw mismatch_error("shard_state", fmt::format("the set's shard files hold {} of the {} elements of this rank's shard.", elems - left, elems),
                         "load a set whose files all come from one save of one job (every rank's shard file).");
  shard_state = std::move(out);
  return it;
}
}  // namespace detail

/// load_checkpoint, and the trainer's per-shard state saved with it, packed over ex.shard() as it
/// is after the load (into `shard_state`, one vector per array saved). On the saving job's ranks
/// and plan each rank reads its own file; otherwise (another number of ranks, other buckets or
/// another split) each element of the new shard comes from the first old file, this rank's own
/// first, whose shard held it. Every file read is validated; a set without shard files, of
/// another layout, composition, pool order or iteration, or whose shards do not cover this rank's
/// raises a typed error naming it; ex (its state before the call put back) and shard_state are then
/// unchanged. A file whose shard was empty (a rank that held no element) may hold no arrays.
template <class Ex>
  requires requires(const Ex& e) { e.shard(); }
std::uint64_t load_checkpoint(Ex& ex, const std::filesystem::path& root, std::vector<std::vector<float>>& shard_state) {
  const std::vector<std::filesystem::path> files = detail::newest_or_throw(root);
  // A bad shard file is found after the exchanger's own state was loaded: its state before the
  // call is put back then, so a failed load changes nothing.
  std::stringstream before(std::ios::in | std::ios::out | std::ios::binary);
  ex.save_state(before);
  try {
    return detail::load_shard_states(ex, files, detail::load_set(ex, files), shard_state);
  } catch (...) {
    before.seekg(0);
    ex.load_state(before);
    throw;
  }
}


}  // namespace gflow
