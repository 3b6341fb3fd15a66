#pragma once
// gflow::mpi, part 3 of 6: the MPI datatype and ops of every wire_element.
//
// fp16 and bf16 have no MPI datatype; as Horovod does, they travel as a committed 2-byte
// datatype, and sum / max / min use user-defined commutative MPI_Ops that widen to float
// (kernels::to_float), combine, and round back to nearest even (kernels::wire_cast). Each
// pairwise combine rounds, so a 16-bit sum over P ranks rounds P-1 times; the exchanger divides
// before it casts so the partial sums stay in range.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../../dtype.hpp"
#include "../../detail/kernels/cast.hpp"
#include "../transport.hpp"
#include "check.hpp"
#include "large_count.hpp"

namespace gflow::mpi::detail {

template <class T, reduce_op Op>
void combine16(void* in, void* inout, const std::size_t n) noexcept {
  gflow::detail::kernels::combine_wire<Op>(static_cast<const T*>(in), static_cast<T*>(inout), n);  // b = W(a op b), SIMD where available
}

/// The datatype and the three ops of one 16-bit type, created on first use (thread-safe static
/// initialisation; MPI must be initialised by then). They live until the process ends: MPI
/// releases them in MPI_Finalize, and freeing them later would be an error.
template <class T>
struct types16 {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;

  types16() {
    const std::string where = std::string("while creating the ") + std::string(to_string(dtype_of_v<T>)) + " datatype";
    check(MPI_Type_contiguous(2, MPI_BYTE, &type), "MPI_Type_contiguous", where);
    check(MPI_Type_commit(&type), "MPI_Type_commit", where);
    check(op_create(&user_fn<&combine16<T, reduce_op::sum>>, &sum), "MPI_Op_create", where);
    check(op_create(&user_fn<&combine16<T, reduce_op::max>>, &max), "MPI_Op_create", where);
    check(op_create(&user_fn<&combine16<T, reduce_op::min>>, &min), "MPI_Op_create", where);
  }
  static const types16& get() {
    static const types16 t;
    return t;
  }
};

template <class T>
inline constexpr bool is16 = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <wire_element T>
MPI_Datatype datatype() {
  if constexpr (is16<T>) return types16<T>::get().type;
  else if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else static_assert(sizeof(T) == 0, "gflow::mpi: no MPI datatype for this wire_element; add it to detail::datatype().");
}

template <wire_element T>
MPI_Op op(reduce_op o) {
  if constexpr (is16<T>) {
    const auto& t = types16<T>::get();
    switch (o) {
      case reduce_op::sum: return t.sum;
      case reduce_op::max: return t.max;
      case reduce_op::min: return t.min;
    }
    return t.sum;
  } else {
    switch (o) {
      case reduce_op::sum: return MPI_SUM;
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
    }
    return MPI_SUM;
  }
}

}  // namespace gflow::mpi::detail
