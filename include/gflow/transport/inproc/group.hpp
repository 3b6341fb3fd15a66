#pragma once
// The in-process transport's shared state and its operations (transport/inproc.hpp): the group
// of P threads, the slot a collective meets in, and what the last rank to arrive executes.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "../../detail/kernels/cast.hpp"

namespace gflow::inproc {

namespace detail {

enum class kind : std::uint8_t { all_reduce, all_gather, broadcast, reduce, barrier, split, all_to_all, all_to_allv, all_gatherv, reduce_scatter, all_gatherv_in_place };

inline const char* name(kind k) {
  switch (k) {
    case kind::all_reduce: return "all_reduce";
    case kind::all_gather: return "all_gather";
    case kind::broadcast: return "broadcast";
    case kind::reduce: return "reduce";
    case kind::barrier: return "barrier";
    case kind::split: return "split";
    case kind::all_to_all: return "all_to_all";
    case kind::all_to_allv: return "all_to_allv";
    case kind::all_gatherv: return "all_gatherv";
    case kind::reduce_scatter: return "reduce_scatter";
    case kind::all_gatherv_in_place: return "all_gatherv_in_place";
  }
  return "?";
}

struct signature {
  kind k{};
  dtype type{};
  std::size_t count = 0;
  reduce_op op{};
  int root = 0;
  friend bool operator==(const signature&, const signature&) = default;
  [[nodiscard]] std::string str() const {
    std::string s = name(k);
    s += fmt::format("({} x {}", count, to_string(type));
    if (k == kind::all_reduce || k == kind::reduce || k == kind::reduce_scatter) s += ", " + std::string(to_string(op));
    if (k == kind::broadcast || k == kind::reduce) s += fmt::format(", root {}", root);
    return s + ")";
  }
};

struct group;

struct split_io {
  int color = 0;
  int key = 0;
  std::shared_ptr<group> out;
  int out_rank = -1;
};

struct slot {
  signature sig;
  std::vector<signature> sigs;        // per rank, for the mismatch message
  std::vector<void*> ptr;             // per rank: in/out buffer
  std::vector<const void*> cptr;      // per rank: send buffer (all_gather, all_to_all(v), all_gatherv)
  std::vector<const std::size_t*> scounts, rcounts;  // per rank: the v-collectives' counts (P each; all_gatherv: rcounts)
  std::vector<char> present;
  int arrived = 0;
  int waited = 0;
  bool executing = false;             // the last rank to arrive is running exec (buffers in use)
  bool abandoned = false;             // a rank timed out and left: never execute (its buffer may be gone)
  bool done = false;
  std::string error;                  // set when ranks disagree
  void (*exec)(slot&, group&) = nullptr;
};

struct message {
  dtype type;
  std::size_t count;
  std::vector<unsigned char> data;
};

struct group {
  explicit group(int n, std::chrono::milliseconds to) : size(n), timeout(to) {}
  int size;
  std::chrono::milliseconds timeout;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::uint64_t, slot> slots;
  std::map<std::pair<int, int>, std::deque<message>> mail;  // (src, dst) -> FIFO
  std::string label = "world";
};

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

template <class T>
acc_t<T> load(const T& v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return gflow::detail::kernels::to_float(v);
  else return v;
}

template <class T>
T store(acc_t<T> v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return gflow::detail::kernels::wire_cast<T>(v);
  else return v;
}

template <class A>
A combine(reduce_op op, A a, A b) {
  switch (op) {
    case reduce_op::sum: return a + b;
    case reduce_op::max: return b > a ? b : a;
    case reduce_op::min: return b < a ? b : a;
  }
  return a;
}

// 16-bit types: the same fp32 accumulation in rank order and one rounding per element, in
// blocks of a stack buffer, so that widening, the op and the rounding run as the SIMD kernels
// of kernels/cast.hpp (bitwise identical to load / combine / store above).
template <class T, reduce_op Op>
void reduce16_op(slot& s, group& g, bool all) {
  constexpr std::size_t block = 2048;
  float acc[block];
  const std::size_t n = s.sig.count;
  for (std::size_t base = 0; base < n; base += block) {
    const std::size_t m = n - base < block ? n - base : block;
    (void)gflow::detail::kernels::wire_to_float(static_cast<const T*>(s.ptr[0]) + base, acc, m);
    for (int r = 1; r < g.size; ++r) gflow::detail::kernels::accumulate_wire<Op>(static_cast<const T*>(s.ptr[r]) + base, acc, m);
    T* first = static_cast<T*>(s.ptr[all ? 0 : s.sig.root]) + base;
    gflow::detail::kernels::to_wire(acc, first, m);
    if (all)
      for (int r = 1; r < g.size; ++r) std::memcpy(static_cast<T*>(s.ptr[r]) + base, first, m * sizeof(T));
  }
}

template <class T>
void reduce16(slot& s, group& g, bool all) {
  switch (s.sig.op) {
    case reduce_op::sum: return reduce16_op<T, reduce_op::sum>(s, g, all);
    case reduce_op::max: return reduce16_op<T, reduce_op::max>(s, g, all);
    case reduce_op::min: return reduce16_op<T, reduce_op::min>(s, g, all);
  }
}

template <class T>
void exec_all_reduce(slot& s, group& g) {
  if constexpr (gflow::detail::kernels::is_wire16<T>) return reduce16<T>(s, g, true);
  const std::size_t n = s.sig.count;
  for (std::size_t j = 0; j < n; ++j) {
    acc_t<T> acc = load(static_cast<T*>(s.ptr[0])[j]);
    for (int r = 1; r < g.size; ++r) acc = combine(s.sig.op, acc, load(static_cast<T*>(s.ptr[r])[j]));
    const T out = store<T>(acc);
    for (int r = 0; r < g.size; ++r) static_cast<T*>(s.ptr[r])[j] = out;
  }
}

template <class T>
void exec_reduce(slot& s, group& g) {
  if constexpr (gflow::detail::kernels::is_wire16<T>) return reduce16<T>(s, g, false);
  const std::size_t n = s.sig.count;
  T* root = static_cast<T*>(s.ptr[s.sig.root]);
  for (std::size_t j = 0; j < n; ++j) {
    acc_t<T> acc = load(static_cast<T*>(s.ptr[0])[j]);
    for (int r = 1; r < g.size; ++r) acc = combine(s.sig.op, acc, load(static_cast<T*>(s.ptr[r])[j]));
    root[j] = store<T>(acc);
  }
}

template <class T>
void exec_all_gather(slot& s, group& g) {
  const std::size_t n = s.sig.count;
  for (int dst = 0; dst < g.size; ++dst)
    for (int src = 0; src < g.size; ++src)
      if (n) std::memcpy(static_cast<T*>(s.ptr[dst]) + static_cast<std::size_t>(src) * n, s.cptr[src], n * sizeof(T));
}

template <class T>
void exec_broadcast(slot& s, group& g) {
  const std::size_t n = s.sig.count;
  for (int r = 0; r < g.size; ++r)
    if (r != s.sig.root && n) std::memcpy(s.ptr[r], s.ptr[s.sig.root], n * sizeof(T));
}

inline void exec_barrier(slot&, group&) {}

template <class T>
void exec_all_to_all(slot& s, group& g) {
  const std::size_t n = s.sig.count;
  for (int dst = 0; dst < g.size; ++dst)
    for (int src = 0; src < g.size; ++src)
      if (n)
        std::memcpy(static_cast<T*>(s.ptr[dst]) + static_cast<std::size_t>(src) * n,
                    static_cast<const T*>(s.cptr[src]) + static_cast<std::size_t>(dst) * n, n * sizeof(T));
}

// The v-collectives first check that every pair agrees on its counts (else s.error: a
// mismatch_error on every rank, and nothing is copied), then copy the packed blocks.
template <class T>
void exec_all_to_allv(slot& s, group& g) {
  const auto P = static_cast<std::size_t>(g.size);
  for (std::size_t src = 0; src < P; ++src)
    for (std::size_t dst = 0; dst < P; ++dst)
      if (s.scounts[src][dst] != s.rcounts[dst][src]) {
        s.error = fmt::format("all_to_allv: rank {} sends {} elements to rank {}, which expects {}", src, s.scounts[src][dst], dst, s.rcounts[dst][src]);
        return;
      }
  std::vector<std::size_t> sdisp(P * P, 0);  // sdisp[src * P + dst]: where src's block for dst starts
  for (std::size_t src = 0; src < P; ++src)
    for (std::size_t dst = 1; dst < P; ++dst) sdisp[src * P + dst] = sdisp[src * P + dst - 1] + s.scounts[src][dst - 1];
  for (std::size_t dst = 0; dst < P; ++dst) {
    std::size_t at = 0;
    for (std::size_t src = 0; src < P; ++src) {
      const std::size_t c = s.rcounts[dst][src];
      if (c) std::memcpy(static_cast<T*>(s.ptr[dst]) + at, static_cast<const T*>(s.cptr[src]) + sdisp[src * P + dst], c * sizeof(T));
      at += c;
    }
  }
}

template <class T>
void exec_all_gatherv(slot& s, group& g) {
  const auto P = static_cast<std::size_t>(g.size);
  for (std::size_t dst = 0; dst < P; ++dst)
    for (std::size_t src = 0; src < P; ++src)
      if (s.rcounts[dst][src] != s.scounts[src][0]) {
        s.error = fmt::format("all_gatherv: rank {} contributes {} elements, rank {} expects {}", src, s.scounts[src][0], dst, s.rcounts[dst][src]);
        return;
      }
  for (std::size_t dst = 0; dst < P; ++dst) {
    std::size_t at = 0;
    for (std::size_t src = 0; src < P; ++src) {
      const std::size_t c = s.scounts[src][0];
      if (c) std::memcpy(static_cast<T*>(s.ptr[dst]) + at, s.cptr[src], c * sizeof(T));
      at += c;
    }
  }
}

// reduce_scatter and all_gatherv_in_place: every rank passes the same P block counts (rcounts);
// the total is in the signature. A rank whose counts differ is a mismatch_error on every rank.
inline bool same_blocks(slot& s, group& g, const char* op) {
  const auto P = static_cast<std::size_t>(g.size);
  for (std::size_t r = 1; r < P; ++r)
    for (std::size_t q = 0; q < P; ++q)
      if (s.rcounts[r][q] != s.rcounts[0][q]) {
        s.error = fmt::format("{}: rank {} gives block {} {} elements, rank 0 gives it {}", op, r, q, s.rcounts[r][q], s.rcounts[0][q]);
        return false;
      }
  return true;
}

// Block q of every rank's send buffer, reduced in rank order 0, 1, ..., P-1 exactly as
// exec_all_reduce reduces each element (16-bit types: the same fp32 accumulation and one
// rounding, through the kernels reduce16_op uses), into rank q's recv buffer: so a
// reduce_scatter's blocks are bitwise the all_reduce of the same buffers.
template <class T, reduce_op Op>
void reduce_block16(slot& s, group& g, std::size_t off, T* out, std::size_t n) {
  constexpr std::size_t block = 2048;
  float acc[block];
  for (std::size_t base = 0; base < n; base += block) {
    const std::size_t m = n - base < block ? n - base : block;
    (void)gflow::detail::kernels::wire_to_float(static_cast<const T*>(s.cptr[0]) + off + base, acc, m);
    for (int r = 1; r < g.size; ++r) gflow::detail::kernels::accumulate_wire<Op>(static_cast<const T*>(s.cptr[r]) + off + base, acc, m);
    gflow::detail::kernels::to_wire(acc, out + base, m);
  }
}

template <class T>
void exec_reduce_scatter(slot& s, group& g) {
  if (!same_blocks(s, g, "reduce_scatter")) return;
  std::size_t off = 0;
  for (int q = 0; q < g.size; ++q) {
    const std::size_t n = s.rcounts[0][q];
    T* out = static_cast<T*>(s.ptr[q]);
    if constexpr (gflow::detail::kernels::is_wire16<T>) {
      switch (s.sig.op) {
        case reduce_op::sum: reduce_block16<T, reduce_op::sum>(s, g, off, out, n); break;
        case reduce_op::max: reduce_block16<T, reduce_op::max>(s, g, off, out, n); break;
        case reduce_op::min: reduce_block16<T, reduce_op::min>(s, g, off, out, n); break;
      }
    } else {
      for (std::size_t j = 0; j < n; ++j) {
        acc_t<T> acc = load(static_cast<const T*>(s.cptr[0])[off + j]);
        for (int r = 1; r < g.size; ++r) acc = combine(s.sig.op, acc, load(static_cast<const T*>(s.cptr[r])[off + j]));
        out[j] = store<T>(acc);
      }
    }
    off += n;
  }
}

template <class T>
void exec_all_gatherv_in_place(slot& s, group& g) {
  if (!same_blocks(s, g, "all_gatherv_in_place")) return;
  std::size_t off = 0;
  for (int src = 0; src < g.size; ++src) {
    const std::size_t n = s.rcounts[0][src];
    for (int dst = 0; dst < g.size; ++dst)
      if (dst != src && n) std::memcpy(static_cast<T*>(s.ptr[dst]) + off, static_cast<const T*>(s.ptr[src]) + off, n * sizeof(T));
    off += n;
  }
}

inline void exec_split(slot& s, group& g) {
  std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, rank)
  for (int r = 0; r < g.size; ++r) {
    auto* io = static_cast<split_io*>(s.ptr[r]);
    by_color[io->color].push_back({io->key, r});
  }
  for (auto& [color, members] : by_color) {
    std::sort(members.begin(), members.end());
    auto sub = std::make_shared<group>(static_cast<int>(members.size()), g.timeout);
    sub->label = fmt::format("{}/{}", g.label, color);
    for (std::size_t i = 0; i < members.size(); ++i) {
      auto* io = static_cast<split_io*>(s.ptr[members[i].second]);
      io->out = sub;
      io->out_rank = static_cast<int>(i);
    }
  }
}

}  // namespace detail

}  // namespace gflow::inproc
