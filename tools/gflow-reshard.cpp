// gflow-reshard: rewrites the checkpoints of a job of P ranks as the checkpoints of a job of P'
// ranks (docs/GUIDE.md, "Restarting on another number of ranks"; the share rule is in
// include/gflow/detail/support/reshard.hpp).
//
//   gflow-reshard --size P' [--sum] --out DIR FILE...
//
// FILE...: the P checkpoints (save_state / save_checkpoint output; any order, each names its rank).
// Writes DIR/rank-<r>.gflow for r = 0 .. P'-1, each atomically (a temporary file renamed over it),
// and only after every input was read and validated: a bad set writes nothing. --sum: the
// exchangers were built with exchange_options::average = false (residuals are added, not scaled
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
    const auto in = gflow::detail::open_all(files);
    const auto p = gflow::detail::pointers(in);
    const std::vector<std::string> set = gflow::reshard_checkpoints(std::span<std::istream* const>(p), size, {average});
    std::filesystem::create_directories(out);
    for (int r = 0; r < size; ++r) gflow::write_file_atomically(gflow::checkpoint_file(out, r), set[static_cast<std::size_t>(r)]);
    std::cout << "gflow-reshard: " << files.size() << " checkpoints -> " << size << " in " << out.string() << " (residuals "
              << (average ? "scaled by P'/P" : "added") << ")\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
