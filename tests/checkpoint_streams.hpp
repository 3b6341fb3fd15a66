#pragma once
// Checkpoints held as strings, read back as the std::istream* spans that the re-sharding calls take
// (exchanger/test_reshard.cpp, exchanger/test_sharding.cpp).
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace gflow_test {

/// One binary input stream per string, each positioned at its start.
struct streams {
  std::vector<std::unique_ptr<std::istringstream>> own;
  std::vector<std::istream*> ptr;
  explicit streams(const std::vector<std::string>& files) {
    for (const auto& f : files) {
      own.push_back(std::make_unique<std::istringstream>(f, std::ios::binary));
      ptr.push_back(own.back().get());
    }
  }
  [[nodiscard]] std::span<std::istream* const> span() const { return ptr; }
};

}  // namespace gflow_test
