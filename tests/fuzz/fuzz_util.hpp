#pragma once
// Shared helpers of the libFuzzer targets: a byte reader that yields zeros once the input is
// exhausted (every input is a valid harness input, so the fuzzer never wastes runs on framing),
// and FUZZ_CHECK, which aborts with the broken invariant so libFuzzer records the input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace fuzz {

struct reader {
  const std::uint8_t* p;
  std::size_t n;
  template <class T>
  T take() noexcept {  // little-endian, zero-filled past the end
    T v{};
    unsigned char b[sizeof(T)] = {};
    const std::size_t m = n < sizeof(T) ? n : sizeof(T);
    if (m) std::memcpy(b, p, m);
    p += m;
    n -= m;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
};

}  // namespace fuzz
