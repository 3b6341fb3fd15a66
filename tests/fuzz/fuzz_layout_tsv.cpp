// libFuzzer target: the layout .tsv parser, gflow::Layout::parse_tsv (layout.hpp).
// Any input either parses to a valid layout (at least one tensor, every tensor named, numel > 0
// and equal to the product of its shape) or throws gflow::parse_error / gflow::invalid_argument
// whose message follows "gflow: <kind> in '<subject>': ...". Any other exception, a crash, a
// sanitizer report or a hang is a finding.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "gflow/layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const gflow::Layout l = gflow::Layout::parse_tsv(text, "fuzz.tsv");
    FUZZ_CHECK(l.size() >= 1);
    std::size_t total = 0;
    for (const auto& t : l.tensors()) {
      FUZZ_CHECK(!t.name.empty());
      FUZZ_CHECK(t.name.find('\t') == std::string::npos && t.name.find('\n') == std::string::npos);
      FUZZ_CHECK(t.numel > 0 && !t.shape.empty());
      std::size_t prod = 1;
      for (std::size_t d : t.shape) prod *= d;
      FUZZ_CHECK(prod == t.numel);
      // The pool holds every tensor: its element count must not wrap around.
      FUZZ_CHECK(!__builtin_add_overflow(total, t.numel, &total));
    }
    FUZZ_CHECK(total == l.total_numel());
  } catch (const gflow::parse_error& e) {
    FUZZ_CHECK(std::string_view(e.what()).rfind("gflow: parse error in '", 0) == 0);
    FUZZ_CHECK(e.subject().rfind("fuzz.tsv", 0) == 0);
  } catch (const gflow::invalid_argument& e) {
    FUZZ_CHECK(std::string_view(e.what()).rfind("gflow: invalid argument in 'layout'", 0) == 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception from parse_tsv: %s\n", e.what());
    std::abort();
  }
  return 0;
}
