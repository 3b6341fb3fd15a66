// bench/simulate.sh only (built with smpicxx, never with the normal build): routes operator new
// through SMPI's malloc interception, so that `--fold BYTES` (smpi/auto-shared-malloc-thresh)
// folds the large buffers the exchanger and the benchmark allocate with new (std::vector): every
// rank's block of that size then maps the same physical memory. Smaller blocks stay each rank's
// own. The aligned forms are left to the C++ library (each pair stays within one allocator).
#include <smpi/smpi.h>

#include <cstddef>
#include <new>

void* operator new(std::size_t n) {
  void* p = smpi_shared_malloc_intercept(n == 0 ? 1 : n, __FILE__, __LINE__);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept {
  if (p != nullptr) smpi_shared_free(p);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }
