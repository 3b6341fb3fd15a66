// bench/simulate.sh only: the memory folding of `--fold BYTES`, built into its own shared library
// (build-sim/libgflow_simfold.so) because SMPI loads a private copy of the benchmark for every
// rank (smpi/privatization: each copy has its own globals), while a library the benchmark links
// is loaded once: its table below is the one place all ranks share.
//
// What is folded: the pool-shaped arrays, and only those. A block qualifies when it holds at
// least BYTES and is 2, 4 or 8 bytes per pool element (the benchmark names the pool's element
// count, gflow_sim_fold_elements): the pool, the residual, the selection's key and position
// arrays, the benchmark's gradient. Their contents are values and in-range positions. Buffers
// sized by k or by P (received blocks, entry lists, their bounds) stay each rank's own: folded,
// one rank's received block would be another's, and OkTopK rejects such a block (measured with
// a size-only rule on ResNet-20 at 4 ranks: "the result block all-gathered from rank 0 was
// rejected: entry 0 has index 202000"). Their reserved capacity costs address space, not memory:
// only the pages written are committed.
//
// A block is keyed by its role: the call stack that allocated it (each frame as an offset in its
// loaded object, so every rank's private copy of the benchmark gives the same key), its exact
// size, and a slot (the lowest one this rank does not hold under that key, so a rank's live
// blocks never share memory). Every rank's block of the same key and slot is the same memory:
// rank r's pool is rank s's pool, never its residual. Memory is one rank's pool-shaped blocks
// instead of P ranks' (a block is freed when the last rank holding it frees it).
//
// What that changes: see "Memory" in bench/simulate.sh's header and docs/DESIGN.md.
//
// GFLOW_SIM_FOLD_BYTES (set by bench/simulate.sh --fold): the threshold; 0 or unset: nothing is
// folded. GFLOW_SIM_FOLD_LOG=1 prints every allocation of at least BYTES (rank, bytes, its role
// or "not pool-shaped (private)", the frames' symbols) on stderr, to see what is folded and what
// is not.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

namespace {

struct key {
  std::uint64_t site;
  std::size_t bytes;
  unsigned slot;
  auto operator<=>(const key&) const = default;
};
struct block {
  void* p;
  int holders;
};
struct state {
  std::mutex mu;
  std::map<key, block> blocks;                                          // (role, slot) -> memory
  std::unordered_map<void*, key> by_pointer;                            // memory -> (role, slot)
  std::map<std::tuple<int, std::uint64_t, std::size_t>, std::set<unsigned>> held;  // rank, role -> slots
  std::size_t live_bytes = 0, peak_bytes = 0, folded_allocations = 0;
};
state& S() {
  static state* s = new state;  // never destroyed: ranks may free after static destruction starts
  return *s;
}
std::size_t pool_elements = 0;  // gflow_sim_fold_elements; 0: nothing is folded
std::size_t threshold() {
  static const std::size_t t = [] {
    const char* v = std::getenv("GFLOW_SIM_FOLD_BYTES");
    return v ? std::strtoull(v, nullptr, 10) : 0ull;
  }();
  return t;
}
bool logging() {
  static const bool l = [] { const char* v = std::getenv("GFLOW_SIM_FOLD_LOG"); return v && v[0] == '1'; }();
  return l;
}

constexpr int frames = 10;

// The table's own containers allocate with operator new, which may be the benchmark's (the
// symbol SMPI's loading makes global): while this library runs, such calls are not folded and
// their frees are not looked up (the caller falls back to malloc / free, which is what they were).
thread_local bool inside = false;
struct enter {
  enter() { inside = true; }
  ~enter() { inside = false; }
};

std::uint64_t site_of(void* const* f, int n) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the frames' offsets in their objects
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    std::uintptr_t off = reinterpret_cast<std::uintptr_t>(f[i]);
    if (dladdr(f[i], &info) != 0 && info.dli_fbase != nullptr) off -= reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    for (int b = 0; b < 8; ++b) h = (h ^ ((off >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

void log_allocation(int rank, std::size_t n, const key& k, bool fresh, void* const* f, int nf) {
  if (k.site == 0) std::fprintf(stderr, "[fold] rank %d: %zu B, not pool-shaped (private):", rank, n);
  else std::fprintf(stderr, "[fold] rank %d: %zu B, role %016llx slot %u%s:", rank, n, static_cast<unsigned long long>(k.site), k.slot,
               fresh ? " (new block)" : "");
  for (int i = 2; i < nf; ++i) {
    Dl_info info{};
    if (dladdr(f[i], &info) == 0 || info.dli_sname == nullptr) continue;
    int st = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    std::fprintf(stderr, "\n    %.160s", st == 0 && d ? d : info.dli_sname);
    std::free(d);
  }
  std::fprintf(stderr, "\n");
}

// At exit: what folding saved, on stderr (bench/simulate.sh --fold).
struct report_at_exit {
  ~report_at_exit() {
    if (threshold() == 0) return;
    auto& s = S();
    std::fprintf(stderr, "bench/simulate.sh: folded blocks of at least %zu B: %zu allocations, at most %.1f MB folded at once\n", threshold(),
                 s.folded_allocations, static_cast<double>(s.peak_bytes) / 1e6);
  }
} report;

}  // namespace

extern "C" {

std::size_t gflow_sim_fold_threshold() { return threshold(); }

// The pool's element count (the benchmark's layout): what makes a block pool-shaped.
void gflow_sim_fold_elements(std::size_t n) { pool_elements = n; }

// A block of n bytes for simulated rank `rank` (>= 0), folded with the other ranks' block of the
// same role; nullptr when n is below the threshold (the caller allocates it privately).
void* gflow_sim_fold_new(std::size_t n, int rank) {
  if (threshold() == 0 || n < threshold() || rank < 0 || inside || pool_elements == 0) return nullptr;
  const enter busy;
  void* f[frames];
  const int nf = backtrace(f, frames);
  if (n % pool_elements != 0 || (n / pool_elements != 2 && n / pool_elements != 4 && n / pool_elements != 8)) {
    if (logging()) log_allocation(rank, n, key{0, n, 0}, false, f, nf);
    return nullptr;
  }
  const std::uint64_t site = site_of(f, nf);
  auto& s = S();
  std::lock_guard lk(s.mu);
  auto& mine = s.held[{rank, site, n}];
  unsigned slot = 0;
  while (mine.count(slot) != 0) ++slot;
  const key k{site, n, slot};
  auto [it, fresh] = s.blocks.try_emplace(k, block{nullptr, 0});
  if (fresh) {
    it->second.p = std::calloc(1, n);  // fresh pages, committed only where touched (a reentrant call: glibc's)
    if (it->second.p == nullptr) {
      s.blocks.erase(it);
      return nullptr;
    }
    s.by_pointer.emplace(it->second.p, k);
    s.live_bytes += n;
    if (s.live_bytes > s.peak_bytes) s.peak_bytes = s.live_bytes;
  }
  ++it->second.holders;
  ++s.folded_allocations;
  mine.insert(slot);
  if (logging()) log_allocation(rank, n, k, fresh, f, nf);
  return it->second.p;
}

// True when p is a folded block (this rank lets go of it; the memory is freed with its last
// holder); false for any other pointer (the caller frees it).
bool gflow_sim_fold_delete(void* p, int rank) {
  if (inside) return false;
  const enter busy;
  auto& s = S();
  std::lock_guard lk(s.mu);
  if (s.by_pointer.empty()) return false;
  const auto bp = s.by_pointer.find(p);
  if (bp == s.by_pointer.end()) return false;
  const key k = bp->second;
  if (rank >= 0) {
    const auto h = s.held.find({rank, k.site, k.bytes});
    if (h != s.held.end()) h->second.erase(k.slot);
  }
  auto b = s.blocks.find(k);
  if (--b->second.holders == 0) {
    std::free(b->second.p);
    s.live_bytes -= k.bytes;
    s.by_pointer.erase(bp);
    s.blocks.erase(b);
  }
  return true;
}

// The size of folded block p, 0 for any other pointer.
std::size_t gflow_sim_fold_bytes(const void* p) {
  if (inside) return 0;
  const enter busy;
  auto& s = S();
  std::lock_guard lk(s.mu);
  const auto bp = s.by_pointer.find(const_cast<void*>(p));
  return bp == s.by_pointer.end() ? 0 : bp->second.bytes;
}

}  // extern "C"
