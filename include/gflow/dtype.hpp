#pragma once
// Element types that travel on the wire. gflow::half and gflow::bfloat16 are plain 16-bit
// storage types with the same bit layout as CUDA's __half / __nv_bfloat16, so a device
// buffer of either can be handed to NCCL or to a kernel by reinterpret_cast.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gflow {

struct half {
  std::uint16_t bits;
  friend constexpr bool operator==(half a, half b) noexcept { return a.bits == b.bits; }
};
struct bfloat16 {
  std::uint16_t bits;
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

enum class dtype : std::uint8_t { f32, f64, f16, bf16, i32, i64, u32, u64, u8 };

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<half> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::uint32_t> { static constexpr dtype value = dtype::u32; };
template <> struct dtype_of<std::uint64_t> { static constexpr dtype value = dtype::u64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// Types a transport may be asked to move.
template <class T>
concept wire_element = requires { dtype_of<T>::value; };

inline constexpr std::size_t size_of(dtype d) noexcept {
  switch (d) {
    case dtype::f64: case dtype::i64: case dtype::u64: return 8;
    case dtype::f32: case dtype::i32: case dtype::u32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::u8: return 1;
  }
  return 0;
}

inline constexpr std::string_view to_string(dtype d) noexcept {
  switch (d) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u32: return "u32";
    case dtype::u64: return "u64";
    case dtype::u8: return "u8";
  }
  return "?";
}

enum class reduce_op : std::uint8_t { sum, max, min };

inline constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

/// Where a transport's buffers live. The exchanger allocates its pool there and picks the
/// matching kernels (host loops, or the CUDA kernels of include/gflow/cuda/).
struct host_memory {};
struct device_memory {};

}  // namespace gflow
