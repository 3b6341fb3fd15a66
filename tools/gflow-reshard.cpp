// gflow-reshard: rewrites the checkpoints of a job of P ranks as the checkpoints of a job of P'
// ranks (docs/GUIDE.md, "Restarting on another number of ranks"; the share rule is in
// include/gflow/detail/support/reshard.hpp).
//
//   gflow-reshard --size P' [--sum] --out DIR FILE...
//
// FILE...: the P checkpoints (save_state / save_checkpoint output; any order, each names its rank)
// and, with Sharding<ReduceScatter>, the P shard state files save_checkpoint(ex, root, state) wrote
// beside them (shard-<r>.gflow; told apart by their contents, so `iter-<n>/*.gflow` passes both).
// Writes DIR/rank-<r>.gflow, and DIR/shard-<r>.gflow when shard files were given, for
// r = 0 .. P'-1, each atomically (a temporary file renamed over it; the shard files first, as
// save_checkpoint does), and only after every input was read and validated: a bad set writes
// nothing. load_checkpoint(ex, root, state) reads DIR as a set when DIR is root/iter-<n>. --sum:
// the exchangers were built with exchange_options::average = false (residuals are added, not scaled
// by P'/P). Exit status 0 on success, 1 on a gflow error (printed), 2 on a usage error.
#include <gflow/reshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {
int usage(const char* why) {
  std::cerr << "gflow-reshard: " << why << "\n"
            << "usage: gflow-reshard --size P' [--sum] --out DIR FILE...\n"
               "  rewrites the P checkpoint FILEs of a job of P ranks into DIR/rank-<r>.gflow, r < P'.\n"
               "  shard state FILEs (shard-<r>.gflow, Sharding<ReduceScatter>) among them are rewritten into DIR/shard-<r>.gflow.\n"
               "  --sum   the exchangers sum (exchange_options::average = false): residuals are added, not scaled.\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  int size = 0;
  bool average = true;
  std::filesystem::path out;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size" && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > (1L << 20)) return usage("--size takes a positive number of ranks");
      size = static_cast<int>(v);
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--sum") {
      average = false;
    } else if (a == "-h" || a == "--help") {
      usage("help");
      return 0;
    } else if (a.starts_with("--")) {
      return usage(("unknown option " + a).c_str());
    } else {
      files.emplace_back(a);
    }
  }
  if (size == 0) return usage("--size is missing");
  if (out.empty()) return usage("--out is missing");
  if (files.empty()) return usage("no checkpoint file was given");
  try {
    const auto in = gflow::detail::open_all(files);  // a file that cannot be opened: a typed error naming it
    std::vector<std::istream*> checkpoints, shard_states;
    for (std::size_t i = 0; i < in.size(); ++i) {
      bool shard = false;
      try {
        shard = gflow::is_shard_state(*in[i]);
      } catch (const gflow::parse_error& e) {
        throw gflow::parse_error("checkpoints", "'" + files[i].string() + "' cannot be read: " + e.what(),
                                 "pass intact files written by save_checkpoint (rank-<r>.gflow, shard-<r>.gflow).");
      }
      (shard ? shard_states : checkpoints).push_back(in[i].get());
      in[i]->clear();
      in[i]->seekg(0);
    }
    if (checkpoints.empty()) return usage("only shard state files were given: pass the rank-<r>.gflow checkpoints of the same save too");
    gflow::resharded_set set;
    if (shard_states.empty())
      set.checkpoints = gflow::reshard_checkpoints(std::span<std::istream* const>(checkpoints), size, {average});
    else
      set = gflow::reshard_checkpoints(std::span<std::istream* const>(checkpoints), std::span<std::istream* const>(shard_states), size, {average});
    std::filesystem::create_directories(out);
    for (int r = 0; r < size; ++r)
      if (!set.shard_states.empty()) gflow::write_file_atomically(gflow::shard_state_file(out, r), set.shard_states[static_cast<std::size_t>(r)]);
    for (int r = 0; r < size; ++r) gflow::write_file_atomically(gflow::checkpoint_file(out, r), set.checkpoints[static_cast<std::size_t>(r)]);
    std::cout << "gflow-reshard: " << checkpoints.size() << " checkpoints" << (shard_states.empty() ? "" : " and their shard state") << " -> " << size
              << " in " << out.string() << " (residuals " << (average ? "scaled by P'/P" : "added") << ")\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
