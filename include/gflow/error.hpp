#pragma once
// Typed errors. Every error gflow raises derives from gflow::error and carries
//   - a code (what kind of failure),
//   - the parameter or operation it concerns,
//   - a message written as WHAT / FIX so the user knows what to change.
#include <stdexcept>
#include <string>
#include <string_view>

// {fmt} (Debian libfmt-dev): the headers that raise these errors build their texts with
// fmt::format. CMake consumers link the compiled library through gflow::gflow (fmt::fmt); a build
// that only passes -I include links -lfmt, or defines FMT_HEADER_ONLY (fmt's formatting code is
// then compiled into each translation unit: about 4.5 s of g++ -O3 apiece).
// Under nvcc (checked with CUDA 13.0 and fmt 9.1) two of fmt's settings are changed:
// - fmt turns constexpr off for __NVCC__ (FMT_USE_CONSTEXPR 0), and the host compiler then
//   rejects the constexpr functions that call the no-longer-constexpr ones ("call to
//   non-constexpr function fmt::v9::detail::ignore_unused"): constexpr is turned back on;
// - nvcc's front end rejects fmt's consteval check of format strings ("call to consteval function
//   ... did not produce a valid constant expression"): in CUDA translation units a format string
//   is checked when it is formatted; the host compiler checks them all at compile time in the
//   .cpp builds (every header is compiled by the host tests).
#if defined(__CUDACC__)
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif
#ifndef FMT_CONSTEVAL
#define FMT_CONSTEVAL
#endif
#endif
#include <fmt/format.h>

namespace gflow {

enum class errc {
  invalid_argument,  // a value passed in is out of its allowed range
  usage,             // a call made in the wrong state (ready() twice, finish() too early...)
  mismatch,          // ranks disagree (layout, collective signature)
  transport,         // the underlying MPI / NCCL / in-process transport failed
  timeout,           // a blocking wait ran past its deadline
  parse,             // a layout file or message could not be read
};

inline constexpr std::string_view to_string(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument: return "invalid argument";
    case errc::usage: return "usage error";
    case errc::mismatch: return "rank mismatch";
    case errc::transport: return "transport error";
    case errc::timeout: return "timeout";
    case errc::parse: return "parse error";
  }
  return "error";
}

class error : public std::runtime_error {
 public:
  error(errc code, std::string subject, std::string_view what, std::string_view fix)
      : std::runtime_error(compose(code, subject, what, fix)), code_(code), subject_(std::move(subject)) {}
  [[nodiscard]] errc code() const noexcept { return code_; }
  /// The parameter or operation the error is about ("threshold", "tensor", "all_reduce").
  [[nodiscard]] const std::string& subject() const noexcept { return subject_; }

 private:
  static std::string compose(errc code, std::string_view subject, std::string_view what, std::string_view fix) {
    std::string m = "gflow: ";
    m += to_string(code);
    m += " in '";
    m += subject;
    m += "': ";
    m += what;
    if (!fix.empty()) {
      m += " Fix: ";
      m += fix;
    }
    return m;
  }
  errc code_;
  std::string subject_;
};

#define GFLOW_DEFINE_ERROR(name, code_)                                                  \
  class name : public error {                                                            \
   public:                                                                               \
    name(std::string subject, std::string_view what, std::string_view fix = {})          \
        : error(errc::code_, std::move(subject), what, fix) {}                           \
  };
GFLOW_DEFINE_ERROR(invalid_argument, invalid_argument)
GFLOW_DEFINE_ERROR(usage_error, usage)
GFLOW_DEFINE_ERROR(mismatch_error, mismatch)
GFLOW_DEFINE_ERROR(transport_error, transport)
GFLOW_DEFINE_ERROR(timeout_error, timeout)
GFLOW_DEFINE_ERROR(parse_error, parse)
#undef GFLOW_DEFINE_ERROR

}  // namespace gflow
