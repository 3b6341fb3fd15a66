#pragma once
// CUDA twins of include/gflow/detail/kernels/cast.hpp: the Precision policy's kernels on device memory.
// Same semantics and bit-identical results as the host versions:
//
//   scale_to_wire<W>(in, out, n, scale, stream)        out[i] = W(in[i] * scale)
//   wire_to_float<W>(in, out, n, counter, stream)      out[i] = float(in[i]); *counter += #non-finite
//   scale_in_place(buf, n, scale, counter, stream)     buf[i] *= scale;        *counter += #non-finite
//   count_nonfinite(buf, n, counter, stream)                                   *counter += #non-finite
//   add_in_place(dst, src, n, stream)                  dst[i] += src[i]  (gradient accumulation)
//
// W is float, gflow::half or gflow::bfloat16 (same bits as __half / __nv_bfloat16). Pointers are
// device pointers of the current device; `counter` is one device-resident unsigned long long
// (nullptr: do not count, where the parameter is optional). Every call only enqueues work on
// `stream` and returns; it throws gflow::transport_error if the launch fails.
//
// Bit identity with the host kernels, whatever the compile flags: the product is an explicit
// `mul.rn.f32` and the casts are explicit `cvt.rn.f16.f32` / `cvt.rn.bf16.f32` in inline PTX,
// so -ftz=true or --use_fast_math (which would flush subnormal products and bf16 subnormals) do
// not change the results; inf / NaN are detected from the exponent bits, not with isfinite.
// The hardware conversions round to nearest even and produce the canonical NaN 0x7fff, exactly
// as CUDA's own __float2half_rn / __float2bfloat16_rn and as gflow::detail::kernels::to_half /
// to_bfloat16 (tests/cuda/ checks all three against each other). Widening is exact; a NaN
// keeps its sign and payload, as in gflow::detail::kernels::to_float (CUDA's __half2float would return
// the canonical 0x7fffffff there, so it is not used for NaN).
//
// Shape of the kernels: grid-stride loops over 4-element vectors (float4 and 8-byte packs of
// four 16-bit values) when the pointers allow it — a scalar head aligns the fp32 pointer to 16
// bytes and, when the wire pointer is then aligned as well, the body runs vectorised with a
// scalar tail; otherwise the whole range runs scalar. Non-finite results are counted per thread
// and added with one atomicAdd per warp (warp-aggregated), at most one per warp per launch.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "check.cuh"
#include "launch.cuh"

namespace gflow::detail::cuda {

namespace kernel_detail {

inline constexpr unsigned block_threads = 256;
// Grid-stride loops: 4096 blocks x 256 threads keep every SM of an H100/H200 (132 SMs x 2048
// threads) busy several times over; more blocks only add scheduling and atomics.
inline constexpr std::size_t max_blocks = 4096;

inline unsigned grid_for(std::size_t work) { return blocks_for(work, block_threads, max_blocks); }

/// How a range of n elements is cut for 4-wide vector access: [0, head) scalar,
/// [head, head + 4 * nvec) vectorised, the rest scalar.
struct vec_split {
  std::size_t head;
  std::size_t nvec;
};

/// f32 is the fp32 pointer (16-byte alignment wanted); other, if given, the wire pointer with
/// elements of other_size bytes (4 * other_size alignment wanted at the same element).
inline vec_split split_for_vectors(const void* f32, const void* other, std::size_t other_size, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(f32);
  if (a % alignof(float) != 0) return {n, 0};
  std::size_t head = ((16 - (a & 15u)) & 15u) / sizeof(float);
  if (head >= n) return {n, 0};
  if (other != nullptr) {
    const auto b = reinterpret_cast<std::uintptr_t>(other) + head * other_size;
    if (b % (4 * other_size) != 0) return {n, 0};
  }
  return {head, (n - head) / 4};
}

__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ bool nonfinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

/// Per-wire-type element access on device: raw storage type, scalar and 4-wide conversions.
template <class W>
struct wire_ops;

template <>
struct wire_ops<float> {
  using raw = float;
  static __device__ __forceinline__ raw from_float(float v) { return v; }
  static __device__ __forceinline__ float to_float(raw r) { return r; }
  static __device__ __forceinline__ void store4(raw* p, float a, float b, float c, float d) {
    *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
  }
  static __device__ __forceinline__ float4 load4(const raw* p) { return *reinterpret_cast<const float4*>(p); }
};

struct wire16_ops {
  using raw = std::uint16_t;
  static __device__ __forceinline__ void store_raw4(raw* p, raw a, raw b, raw c, raw d) {
    uint2 v;
    v.x = static_cast<unsigned>(a) | (static_cast<unsigned>(b) << 16);
    v.y = static_cast<unsigned>(c) | (static_cast<unsigned>(d) << 16);
    *reinterpret_cast<uint2*>(p) = v;
  }
  static __device__ __forceinline__ uint2 load_raw4(const raw* p) { return *reinterpret_cast<const uint2*>(p); }
};

template <>
struct wire_ops<half> : wire16_ops {
  static __device__ __forceinline__ raw from_float(float v) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
  static __device__ __forceinline__ float to_float(raw r) {
    const unsigned u = r;
    // NaN keeps its sign and payload, as in gflow::detail::kernels::to_float (CUDA's __half2float
    // returns the canonical 0x7fffffff instead); every other value converts exactly.
    if ((u & 0x7c00u) == 0x7c00u && (u & 0x3ffu) != 0u)
      return __uint_as_float(((u & 0x8000u) << 16) | 0x7f800000u | ((u & 0x3ffu) << 13));
    float f;
    const unsigned short h = r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
  static __device__ __forceinline__ void store4(raw* p, float a, float b, float c, float d) {
    store_raw4(p, from_float(a), from_float(b), from_float(c), from_float(d));
  }
  static __device__ __forceinline__ float4 load4(const raw* p) {
    const uint2 v = load_raw4(p);
    return make_float4(to_float(static_cast<raw>(v.x & 0xffffu)), to_float(static_cast<raw>(v.x >> 16)),
                       to_float(static_cast<raw>(v.y & 0xffffu)), to_float(static_cast<raw>(v.y >> 16)));
  }
};

template <>
struct wire_ops<bfloat16> : wire16_ops {
  static __device__ __forceinline__ raw from_float(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
#else
    // No bf16 conversion instruction before sm_80: the host algorithm, in integers.
    const unsigned x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    unsigned result = x >> 16;
    const unsigned remainder = x << 16;
    if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u))) ++result;
    return static_cast<raw>(result);
#endif
  }
  static __device__ __forceinline__ float to_float(raw r) { return __uint_as_float(static_cast<unsigned>(r) << 16); }
  static __device__ __forceinline__ void store4(raw* p, float a, float b, float c, float d) {
    store_raw4(p, from_float(a), from_float(b), from_float(c), from_float(d));
  }
  static __device__ __forceinline__ float4 load4(const raw* p) {
    const uint2 v = load_raw4(p);
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
  }
};

template <class W>
using raw_t = typename wire_ops<W>::raw;

/// Adds the warp's non-finite counts with one atomic. Every lane of the warp must call it
/// (the kernels below call it once, after their loops, from every thread).
__device__ __forceinline__ void warp_add(unsigned long long* counter, unsigned long long local) {
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31u) == 0 && local != 0) atomicAdd(counter, local);
}

template <class W>
__global__ void __launch_bounds__(block_threads)
    scale_to_wire_kernel(const float* __restrict__ in, raw_t<W>* __restrict__ out, std::size_t n, float s, vec_split cut) {
  using ops = wire_ops<W>;
  const std::size_t tid = thread_index();
  const std::size_t stride = grid_stride();
  for (std::size_t i = tid; i < cut.head; i += stride) out[i] = ops::from_float(mul_rn(in[i], s));
  const float* vin = in + cut.head;
  raw_t<W>* vout = out + cut.head;
  for (std::size_t v = tid; v < cut.nvec; v += stride) {
    const float4 x = *reinterpret_cast<const float4*>(vin + 4 * v);
    ops::store4(vout + 4 * v, mul_rn(x.x, s), mul_rn(x.y, s), mul_rn(x.z, s), mul_rn(x.w, s));
  }
  for (std::size_t i = cut.head + 4 * cut.nvec + tid; i < n; i += stride) out[i] = ops::from_float(mul_rn(in[i], s));
}

template <class W>
__global__ void __launch_bounds__(block_threads)
    wire_to_float_kernel(const raw_t<W>* __restrict__ in, float* __restrict__ out, std::size_t n,
                         unsigned long long* counter, vec_split cut) {
  using ops = wire_ops<W>;
  const std::size_t tid = thread_index();
  const std::size_t stride = grid_stride();
  unsigned long long bad = 0;
  for (std::size_t i = tid; i < cut.head; i += stride) {
    const float v = ops::to_float(in[i]);
    out[i] = v;
    bad += nonfinite(v);
  }
  const raw_t<W>* vin = in + cut.head;
  float* vout = out + cut.head;
  for (std::size_t v = tid; v < cut.nvec; v += stride) {
    const float4 x = ops::load4(vin + 4 * v);
    *reinterpret_cast<float4*>(vout + 4 * v) = x;
    bad += nonfinite(x.x) + nonfinite(x.y) + nonfinite(x.z) + nonfinite(x.w);
  }
  for (std::size_t i = cut.head + 4 * cut.nvec + tid; i < n; i += stride) {
    const float v = ops::to_float(in[i]);
    out[i] = v;
    bad += nonfinite(v);
  }
  if (counter != nullptr) warp_add(counter, bad);
}

template <bool Scale>
__global__ void __launch_bounds__(block_threads)
    scale_count_kernel(float* __restrict__ buf, std::size_t n, float s, unsigned long long* counter, vec_split cut) {
  const std::size_t tid = thread_index();
  const std::size_t stride = grid_stride();
  unsigned long long bad = 0;
  auto one = [&](std::size_t i) {
    float v = buf[i];
    if constexpr (Scale) {
      v = mul_rn(v, s);
      buf[i] = v;
    }
    bad += nonfinite(v);
  };
  for (std::size_t i = tid; i < cut.head; i += stride) one(i);
  float* vbuf = buf + cut.head;
  for (std::size_t v = tid; v < cut.nvec; v += stride) {
    float4 x = *reinterpret_cast<const float4*>(vbuf + 4 * v);
    if constexpr (Scale) {
      x = make_float4(mul_rn(x.x, s), mul_rn(x.y, s), mul_rn(x.z, s), mul_rn(x.w, s));
      *reinterpret_cast<float4*>(vbuf + 4 * v) = x;
    }
    bad += nonfinite(x.x) + nonfinite(x.y) + nonfinite(x.z) + nonfinite(x.w);
  }
  for (std::size_t i = cut.head + 4 * cut.nvec + tid; i < n; i += stride) one(i);
  if (counter != nullptr) warp_add(counter, bad);
}

inline unsigned grid_for(const vec_split& cut, std::size_t n) {
  const std::size_t scalar = n - 4 * cut.nvec;  // head + tail, or all of n
  return grid_for(cut.nvec > scalar ? cut.nvec : scalar);
}

template <class W>
inline constexpr bool is_wire_type = std::is_same_v<W, float> || std::is_same_v<W, half> || std::is_same_v<W, bfloat16>;

}  // namespace kernel_detail

// The public cast kernels below share one shape on purpose (duplicates pairs them): each checks
// its own W with its own sentence, then launches its kernel on the vector-aligned split.

/// out[i] = W(in[i] * scale), round to nearest even (the "divide before casting" step).
template <class W>
void scale_to_wire(const float* in, W* out, std::size_t n, float scale, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>,
                "gflow::detail::cuda::scale_to_wire<W>: W must be float, gflow::half or gflow::bfloat16.");
  if (n == 0) return;
  using raw = kernel_detail::raw_t<W>;
  const auto cut = kernel_detail::split_for_vectors(in, out, sizeof(W), n);
  kernel_detail::launch(kernel_detail::scale_to_wire_kernel<W>, kernel_detail::grid_for(cut, n), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::scale_to_wire", in, reinterpret_cast<raw*>(out), n, scale, cut);
}

/// out[i] = float(in[i]); adds the number of inf / NaN results to *nonfinite_counter (a device
/// pointer; nullptr: no count).
template <class W>
void wire_to_float(const W* in, float* out, std::size_t n, unsigned long long* nonfinite_counter, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>,
                "gflow::detail::cuda::wire_to_float<W>: W must be float, gflow::half or gflow::bfloat16.");
  if (n == 0) return;
  using raw = kernel_detail::raw_t<W>;
  const auto cut = kernel_detail::split_for_vectors(out, in, sizeof(W), n);
  kernel_detail::launch(kernel_detail::wire_to_float_kernel<W>, kernel_detail::grid_for(cut, n), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::wire_to_float", reinterpret_cast<const raw*>(in), out, n, nonfinite_counter, cut);
}

/// buf[i] *= scale; adds the number of inf / NaN results to *nonfinite_counter (nullptr: no count).
inline void scale_in_place(float* buf, std::size_t n, float scale, unsigned long long* nonfinite_counter, cudaStream_t stream) {
  if (n == 0) return;
  const auto cut = kernel_detail::split_for_vectors(buf, nullptr, 0, n);
  kernel_detail::launch(kernel_detail::scale_count_kernel<true>, kernel_detail::grid_for(cut, n), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::scale_in_place", buf, n, scale, nonfinite_counter, cut);
}

/// Adds the number of inf / NaN values in buf to *nonfinite_counter (required).
inline void count_nonfinite(const float* buf, std::size_t n, unsigned long long* nonfinite_counter, cudaStream_t stream) {
  if (nonfinite_counter == nullptr)
    throw invalid_argument("nonfinite_counter", "gflow::detail::cuda::count_nonfinite needs a device counter to add to (got nullptr).",
                           "pass a device pointer to one zero-initialised unsigned long long.");
  if (n == 0) return;
  const auto cut = kernel_detail::split_for_vectors(buf, nullptr, 0, n);
  // The kernel only reads buf when it does not scale.
  kernel_detail::launch(kernel_detail::scale_count_kernel<false>, kernel_detail::grid_for(cut, n), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::count_nonfinite", const_cast<float*>(buf), n, 1.0f, nonfinite_counter, cut);
}

namespace kernel_detail {
template <class F>  // a template, as every kernel of a header: one definition per program
__global__ void __launch_bounds__(block_threads) add_in_place_kernel(F* __restrict__ dst, const F* __restrict__ src, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __fadd_rn(dst[i], src[i]);  // one IEEE add, as the host's dst[i] + src[i]
}
}  // namespace kernel_detail

/// dst[i] += src[i] (the copying ready(i, source) inside a gradient-accumulation window).
inline void add_in_place(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  kernel_detail::launch(kernel_detail::add_in_place_kernel<float>, kernel_detail::grid_for(n), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::add_in_place", dst, src, n);
}

}  // namespace gflow::detail::cuda
