// bench/simulate.sh only (built with smpicxx, never with the normal build): routes malloc (which
// gflow's host buffers use) and operator new (std::vector) through the pool-shaped folding of
// bench/simulate_fold.cpp (libgflow_simfold.so, one table for all the simulated ranks), so that
// `--fold BYTES` folds the pool-sized arrays the exchanger and the benchmark allocate. Every
// other block, and every block allocated outside a simulated rank, is glibc's. SMPI loads this
// program once per rank with its own symbols first, so these definitions are the ones its code
// calls. The aligned forms of new are left to the C++ library (each pair stays within one
// allocator).
#include <simgrid/actor.h>

#include <cstddef>
#include <cstring>
#include <new>

extern "C" {
std::size_t gflow_sim_fold_threshold();
void* gflow_sim_fold_new(std::size_t n, int rank);
bool gflow_sim_fold_delete(void* p, int rank);
std::size_t gflow_sim_fold_bytes(const void* p);
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void __libc_free(void*);
}

namespace {
int simulated_rank() {
  const sg_actor_t a = sg_actor_self();
  if (a == nullptr) return -1;
  const auto pid = sg_actor_get_pid(a);
  return pid > 0 ? static_cast<int>(pid) : -1;  // pid 0: SimGrid's own (maestro)
}
std::size_t fold_threshold() {
  static const std::size_t t = gflow_sim_fold_threshold();
  return t;
}
}  // namespace

extern "C" {
void* malloc(std::size_t n) {
  if (fold_threshold() != 0 && n >= fold_threshold())
    if (void* p = gflow_sim_fold_new(n, simulated_rank())) return p;
  return __libc_malloc(n);
}
void free(void* p) {
  if (p == nullptr) return;
  if (fold_threshold() != 0 && gflow_sim_fold_delete(p, simulated_rank())) return;
  __libc_free(p);
}
void* calloc(std::size_t n, std::size_t m) {  // GCC turns host_buffer's malloc + memset into calloc
  if (fold_threshold() != 0 && m != 0 && n <= static_cast<std::size_t>(-1) / m && n * m >= fold_threshold())
    if (void* p = gflow_sim_fold_new(n * m, simulated_rank())) return std::memset(p, 0, n * m);
  return __libc_calloc(n, m);
}
void* realloc(void* p, std::size_t n) {
  const std::size_t had = (p != nullptr && fold_threshold() != 0) ? gflow_sim_fold_bytes(p) : 0;
  if (had == 0) return __libc_realloc(p, n);
  void* q = malloc(n);  // a folded block moves: a new block, then the old one let go
  if (q != nullptr) {
    std::memcpy(q, p, had < n ? had : n);
    free(p);
  }
  return q;
}
}

void* operator new(std::size_t n) {
  void* p = malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, std::size_t) noexcept { free(p); }
void operator delete[](void* p, std::size_t) noexcept { free(p); }
