#pragma once
// A minimal test harness for the CUDA test binary (doctest's TEST_CASE_TEMPLATE does not survive
// nvcc, doctest issue #800, and the binary must report "skipped" with exit code 77 on machines
// without a GPU). Checks may run on several host threads (one per NCCL rank).
//
//   GFLOW_CUDA_TEST("kernels", name) { EXPECT(a == b); EXPECT_MSG(ok, "detail " + std::to_string(x)); }
//
// main.cu runs the tests whose suite matches argv[1] (all when absent).
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace gflow_cuda_test {

struct test_case {
  const char* suite;
  const char* name;
  void (*fn)();
};

inline std::vector<test_case>& registry() {
  static std::vector<test_case> r;
  return r;
}
inline std::atomic<int>& failures() {
  static std::atomic<int> f{0};
  return f;
}
inline std::atomic<long long>& checks() {
  static std::atomic<long long> c{0};
  return c;
}
inline std::mutex& print_mutex() {
  static std::mutex m;
  return m;
}

struct registrar {
  registrar(const char* suite, const char* name, void (*fn)()) { registry().push_back({suite, name, fn}); }
};

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::lock_guard lk(print_mutex());
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
}

}  // namespace gflow_cuda_test

#define GFLOW_CUDA_TEST(suite, name)                                                           \
  static void name();                                                                          \
  static const ::gflow_cuda_test::registrar name##_registrar_(suite, #name, &name);            \
  static void name()

#define EXPECT(cond)                                                                           \
  do {                                                                                         \
    ++::gflow_cuda_test::checks();                                                             \
    if (!(cond)) ::gflow_cuda_test::fail(__FILE__, __LINE__, #cond);                           \
  } while (0)

#define EXPECT_MSG(cond, msg)                                                                  \
  do {                                                                                         \
    ++::gflow_cuda_test::checks();                                                             \
    if (!(cond)) ::gflow_cuda_test::fail(__FILE__, __LINE__, std::string(#cond) + ": " + (msg)); \
  } while (0)

/// Expects `expr` to throw an exception of type `type`.
#define EXPECT_THROWS_AS(expr, type)                                                           \
  do {                                                                                         \
    ++::gflow_cuda_test::checks();                                                             \
    bool thrown_ = false;                                                                      \
    try {                                                                                      \
      (void)(expr);                                                                            \
    } catch (const type&) {                                                                    \
      thrown_ = true;                                                                          \
    } catch (...) {                                                                            \
    }                                                                                          \
    if (!thrown_) ::gflow_cuda_test::fail(__FILE__, __LINE__, "expected " #type " from " #expr); \
  } while (0)
