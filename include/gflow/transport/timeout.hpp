#pragma once
// The timeout every gflow transport bounds its blocking waits with, unless told otherwise.
// The transports' constructors and set_timeout() take a timeout explicitly; there is no
// environment variable (CONVENTIONS: no environment knobs) — a trainer that wants it on its
// command line passes it through. Every rank must use the same setting.
#include <chrono>
#include <cstdint>
#include <string>

#include "../error.hpp"

namespace gflow::detail {

/// Ten minutes: far above any healthy wait for one collective (a 1 GiB allreduce over 1 Gbit/s
/// takes ~16 s), short enough that a lost rank does not hold a job for hours. PyTorch's NCCL
/// watchdog also defaults to ten minutes.
inline constexpr std::chrono::milliseconds default_timeout{std::chrono::minutes(10)};

/// Checks a timeout passed to a transport.
inline void check_timeout(std::chrono::milliseconds t) {
  if (t.count() < 0)
    throw invalid_argument("timeout", fmt::format("a timeout of {} ms is negative.", t.count()),
                           "pass a duration >= 0 (0 turns timeouts off).");
}

}  // namespace gflow::detail
